#!/bin/bash
# Device call 1 (this session's split of the bundle): wheels in, the model's first part kept in /tmp.
set -u
export PYTHONUNBUFFERED=1
PY=${PY:-python3}; SITE=${SITE:-/tmp/site}
date -u +%T
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE .device/a/whl/*.whl || exit 1
mkdir -p /tmp/keep && cp .device/a/model.part /tmp/keep/a.part || exit 1
PYTHONPATH=$SITE:src $PY -c "import torch, transformers, gguf, tokenizers, huggingface_hub as h; print('torch', torch.__version__, 'transformers', transformers.__version__, 'tokenizers', tokenizers.__version__, 'hub', h.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else '')"
date -u +%T
