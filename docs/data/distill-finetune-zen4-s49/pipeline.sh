#!/bin/bash
# distill -> capture -> train from the 16k head -> MT-bench acceptance; each step resumes
# run from the checkout's root; the distill ran before it, by hand:
# nice -n 19 eaglespec distill --out runs/distill --max-examples 1024 --max-turns 1 --max-new-tokens 256 --max-length 512 --batch-size 16
B=.venv/bin
until python3 -c "import json,sys; sys.exit(0 if json.load(open('runs/distill/manifest.json'))['complete'] else 1)"; do sleep 30; done
echo "[pipeline] capture $(date)"
nice -n 19 ionice -c3 $B/eaglespec capture --data runs/distill --out runs/cap-distill --max-length 768 || exit 1
echo "[pipeline] train $(date)"
nice -n 19 ionice -c3 $B/eaglespec train --capture-dir runs/cap-distill --init-from smollm2-135m-instruct-16k --epochs 3 --lr 3e-4 --grad-accum 4 --warmup 20 --loss-vocab 8192 --eval-first 32 --checkpoint-every 50 --out runs/head-distill || exit 1
echo "[pipeline] acceptance $(date)"
nice -n 19 $B/python -m eaglespec.bench.acceptance --head runs/head-distill --trees eagle1 --dataset mt-bench --out runs/acc-distill-mt --compile off || exit 1
echo "[pipeline] done $(date)"
