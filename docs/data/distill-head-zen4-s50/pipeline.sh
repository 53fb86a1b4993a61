#!/bin/bash
# distill (2,048 first turns, extending session 49's 1,024) -> capture -> train from the 16k head -> tune;
# each step resumes. Run from the checkout's root; the distill runs before it, by hand:
# nice -n 19 eaglespec distill --out runs/distill --max-examples 2048 --max-turns 1 --max-new-tokens 256 --max-length 512 --batch-size 16
B=.venv/bin
until python3 -c "import json,sys; m=json.load(open('runs/distill/manifest.json')); sys.exit(0 if m['complete'] and m['total'] == 2048 else 1)"; do sleep 30; done
echo "[pipeline] capture $(date)"
nice -n 19 ionice -c3 $B/eaglespec capture --data runs/distill --out runs/cap-distill2k --max-length 768 || exit 1
echo "[pipeline] train $(date)"
nice -n 19 ionice -c3 $B/eaglespec train --capture-dir runs/cap-distill2k --init-from smollm2-135m-instruct-16k --epochs 3 --lr 3e-4 --grad-accum 4 --warmup 20 --loss-vocab 8192 --eval-first 32 --checkpoint-every 50 --out runs/head-distill2k || exit 1
echo "[pipeline] tune $(date)"
nice -n 10 $B/eaglespec tune --head runs/head-distill2k --calibration-from 0 --prompts 32 || exit 1
echo "[pipeline] done $(date)"
