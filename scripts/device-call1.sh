#!/bin/bash
# Device call 1 of docs/gpu.md (carry .device/a): the wheels the GPU image lacks, installed offline
# into $SITE, and the GGUF's first part kept in /tmp for call 2. Prints the versions it will run.
set -u
export PYTHONUNBUFFERED=1
PY=${PY:-python3}; SITE=${SITE:-/tmp/site}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .device/a/whl/*.whl || exit 1
mkdir -p /tmp/keep && cp .device/a/model.part /tmp/keep/a.part || exit 1
PYTHONPATH=$SITE:src $PY -c "import torch, transformers, gguf; print('torch', torch.__version__, 'transformers', \
transformers.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else '')"
