#!/bin/bash
# Device call 2: join the model, the lossless check + benchmark (docs/gpu.md), then the head recipe
# in the time left; everything useful lands in $OUT (at most 8 files).
set -u
T0=$(date +%s); LIMIT=${1:-560}
PY=${PY:-python3}; SITE=${SITE:-/tmp/site}; OUT=${OUT:-/tmp/out}; DEV=${DEV:-cuda}; DRY=${DRY:-}
export PYTHONUNBUFFERED=1 PYTHONPATH=$SITE:$PWD/src EAGLESPEC_COMPILE=off HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
mkdir -p .device/a $OUT
[ -f .device/a/model.part ] || cp /tmp/keep/a.part .device/a/model.part || exit 1
GGUF=$($PY -m eaglespec.tools.gpu_recipe join --bundle .device) || exit 1
echo "joined $GGUF, $(left) s left"
CHECK_CAP=$(( $(left) - 200 )); [ $CHECK_CAP -gt 330 ] && CHECK_CAP=330
timeout $CHECK_CAP $PY -m eaglespec.tools.device_check --device $DEV ${DRY:+--dry-run} --target $GGUF \
  --head .device/h/smollm2-135m-instruct-12k --out /tmp/check > $OUT/check.log 2>&1
echo "check exit $?, $(left) s left"
cp /tmp/check/summary.json $OUT/check-summary.json 2>/dev/null
R=$(( $(left) - 40 ))
MIN=$($PY -c "print(round(max($R - 25, 0) / 60, 2))")
echo "recipe: $MIN minutes"
if [ $R -gt 120 ]; then
  timeout $R $PY -m eaglespec.tools.gpu_recipe run --bundle .device --device $DEV ${DRY:+--dry-run} --out /tmp/recipe \
    --minutes $MIN > $OUT/recipe.log 2>&1
  echo "recipe exit $?, $(left) s left"
fi
cd /tmp && for f in recipe/eagle3/*.safetensors recipe/eagle1/model.safetensors; do
  [ -f "$f" ] && cp "$f" $OUT/$(echo $f | cut -d/ -f2)-$(basename $f); done
tar czf $OUT/small.tgz $(ls -d check recipe/summary.json recipe/eagle3/*.json recipe/eagle1/*.json recipe/eagle1/draft_vocab.safetensors 2>/dev/null)
ls -la $OUT; echo "done, $(left) s left"
