#!/bin/bash
# Device call 2 of docs/gpu.md (carry .device/b): reassemble the GGUF, then the device check with
# the shipped head (unless JOBS leaves it out), then the head recipe in the seconds left of LIMIT.
# Usage: bash scripts/device-call2.sh LIMIT   (LIMIT: seconds this call may run, under its timeout_s)
# Everything that comes back is in $OUT, at most 8 files: the two logs, the check's summary.json,
# the heads' weights, and small.tgz (configs, the check's summary.md, the recipe's summary.json).
# JOBS="check recipe" (default), "check", "recipe", or "probe": scripts/compiled-probe.py, the compiled
# path compiled in-process then as packages (its logs come back); CHECK_ARGS: more options for the check;
# RECIPE_ARGS: more for the recipe (e.g. "--data distill"). BUNDLE (.device) and WORK (/tmp) move
# the bundle and the scratch results (tests/test_gpu_recipe.py runs this script dry on the CPU).
set -u
T0=$(date +%s); LIMIT=${1:-560}
PY=${PY:-python3}; SITE=${SITE:-/tmp/site}; OUT=${OUT:-/tmp/out}; DEV=${DEV:-cuda}; DRY=${DRY:-}
BUNDLE=${BUNDLE:-.device}; WORK=${WORK:-/tmp}; JOBS=${JOBS:-check recipe}; CHECK_ARGS=${CHECK_ARGS:-}; RECIPE_ARGS=${RECIPE_ARGS:-}
case " $JOBS " in *" check "*|*" recipe "*|*" probe "*) ;; *) echo "JOBS=\"$JOBS\": name check, recipe and/or probe"; exit 2;; esac
# eager kernels: the compiled CUDA path crashed on the H200 (docs/gpu.md, the first run)
export PYTHONUNBUFFERED=1 PYTHONPATH=$SITE:$(cd "$(dirname "$0")/.." && pwd)/src EAGLESPEC_COMPILE=off HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
mkdir -p "$BUNDLE/a" "$OUT"; rm -rf "$WORK/check" "$WORK/recipe"  # nothing from an earlier call comes back as new
[ -f "$BUNDLE/a/model.part" ] || cp /tmp/keep/a.part "$BUNDLE/a/model.part" || { echo "no part a: repeat call 1"; exit 1; }
GGUF=$($PY -m eaglespec.tools.gpu_recipe join --bundle "$BUNDLE") || exit 1
echo "joined $GGUF, $(left) s left"
HEAD=$(ls -d "$BUNDLE"/b/head/* 2>/dev/null | head -1)
if [[ " $JOBS " == *" probe "* ]]; then  # first: the one that may crash is the point of it
  n=2
  for variant in off on; do
    P=$(( ($(left) - 30) / n )); n=$(( n - 1 )); [ $P -lt 60 ] && break
    EAGLESPEC_COMPILE=on EAGLESPEC_COMPILE_PACKAGES=$variant timeout -k 10 $P $PY "$(dirname "$0")/compiled-probe.py" \
      "$GGUF" "${HEAD:-default}" $DEV > "$OUT/probe-packages-$variant.log" 2>&1
    echo "probe (packages $variant) exit $?, $(left) s left"
  done
fi
if [[ " $JOBS " == *" check "* ]]; then
  CAP=$(( $(left) - 200 )); [[ " $JOBS " == *" recipe "* ]] || CAP=$(( $(left) - 20 )); [ $CAP -gt 330 ] && [[ " $JOBS " == *" recipe "* ]] && CAP=330
  if [ $CAP -lt 60 ]; then
    echo "check skipped: ${CAP} s is too little (raise LIMIT, or JOBS=recipe)"
  else
    timeout $CAP $PY -m eaglespec.tools.device_check --device $DEV ${DRY:+--dry-run} --target "$GGUF" \
      ${HEAD:+--head $HEAD} --out "$WORK/check" $CHECK_ARGS > "$OUT/check.log" 2>&1
    echo "check exit $?, $(left) s left"
    cp "$WORK/check/summary.json" "$OUT/check-summary.json" 2>/dev/null
  fi
fi
if [[ " $JOBS " == *" recipe "* ]]; then
  R=$(( $(left) - 40 ))
  MIN=$($PY -c "print(round(max($R - 25, 0) / 60, 2))")
  if [ $R -gt 120 ]; then
    echo "recipe: $MIN minutes"
    timeout $R $PY -m eaglespec.tools.gpu_recipe run --bundle "$BUNDLE" --device $DEV ${DRY:+--dry-run} --out "$WORK/recipe" \
      --minutes $MIN $RECIPE_ARGS > "$OUT/recipe.log" 2>&1
    echo "recipe exit $?, $(left) s left"
  fi
fi
cd "$WORK" && for f in recipe/eagle3/*.safetensors recipe/eagle1/model.safetensors; do
  [ -f "$f" ] && cp "$f" "$OUT/$(echo "$f" | cut -d/ -f2)-$(basename "$f")"; done
tar czf "$OUT/small.tgz" $(ls -d check recipe/summary.json recipe/eagle3/*.json recipe/eagle1/*.json \
  recipe/eagle1/draft_vocab.safetensors 2>/dev/null) 2>/dev/null
ls -la "$OUT"; echo "done, $(left) s left"
