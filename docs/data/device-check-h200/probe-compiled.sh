#!/bin/bash
# one-off: the compiled CUDA path (inductor, AOT packages) on the H200: build times and a first timing
set -u
LIMIT=${1:-180}; PY=${PY:-python3}; SITE=${SITE:-/tmp/site}; OUT=${OUT:-/tmp/out}; DEV=${DEV:-cuda}
export PYTHONUNBUFFERED=1 PYTHONPATH=$SITE:$PWD/src HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 EAGLESPEC_COMPILE=${COMPILE:-on}
mkdir -p .device/a "$OUT"
[ -f .device/a/model.part ] || cp /tmp/keep/a.part .device/a/model.part || exit 1
GGUF=$($PY -m eaglespec.tools.gpu_recipe join --bundle .device) || exit 1
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
timeout $LIMIT $PY - "$GGUF" "$DEV" > "$OUT/compiled-cuda.log" 2>&1 <<'PY'
import sys, time, torch
from eaglespec.engine.decoding import EagleGenerator
t = time.time()
dt = torch.bfloat16 if sys.argv[2] == "cuda" else torch.float32
g = EagleGenerator.from_pretrained(sys.argv[1], ".device/b/head/smollm2-135m-instruct-12k", "eagle1", device=sys.argv[2], dtype=dt)
print(f"PROBE loaded and warmed in {time.time() - t:.1f} s: {g.compile_note}", flush=True)
q = "Write a short blog post about a weekend trip to a small coastal town, with two places worth visiting."
sync = torch.cuda.synchronize if sys.argv[2] == "cuda" else (lambda: None)
out = {}
for spec in (False, True, False, True):
    sync(); t = time.perf_counter()
    r = g.generate(q, max_new_tokens=128, speculative=spec)
    sync(); s = time.perf_counter() - t
    tau = sum(x.emitted for x in r.steps) / max(len(r.steps), 1)
    out[spec] = r.token_ids
    print(f"PROBE {'eagle' if spec else 'vanilla'}: {len(r.token_ids)} tokens in {s:.3f} s = {len(r.token_ids) / s:.1f} tok/s, tau {tau:.2f}", flush=True)
print("PROBE identical" if out[False] == out[True] else "PROBE DIFFERENT", flush=True)
PY
echo "probe exit $?"; grep -E "PROBE|compiling|built in|rror" "$OUT/compiled-cuda.log" | tail -40
