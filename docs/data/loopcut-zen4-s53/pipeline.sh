#!/bin/bash
# loop-cut A/B: the sd4k recipe on the same 4,096 distilled first turns, captured with --loop-cut 16
cd "$(dirname "$0")/../../.."  # the repository root
B=.venv/bin
echo "[pipeline] capture $(date)"
nice -n 5 $B/eaglespec capture --data docs/data/distill-4k --out runs/cap-lc4k --max-length 768 --loop-cut 16 || exit 1
echo "[pipeline] train $(date)"
nice -n 5 $B/eaglespec train --capture-dir runs/cap-lc4k --init-from smollm2-135m-instruct-16k --epochs 3 --lr 3e-4 --grad-accum 4 --warmup 20 --loss-vocab 8192 --eval-first 32 --checkpoint-every 50 --out runs/head-lc4k || exit 1
echo "[pipeline] tune $(date)"
nice -n 5 $B/eaglespec tune --head runs/head-lc4k --calibration-from 0 --prompts 32 || exit 1
for set in "mt-bench 0" "tasks 0" "humaneval 40"; do set -- $set
  lim=""; [ "$2" != 0 ] && lim="--limit $2"
  echo "[pipeline] acceptance $1 $(date)"
  $B/python -m eaglespec.bench.acceptance --head runs/head-lc4k --trees eagle1 --dataset $1 $lim --out runs/acc-lc4k-$1 --compile off || exit 1
done
echo "[pipeline] done $(date)"
