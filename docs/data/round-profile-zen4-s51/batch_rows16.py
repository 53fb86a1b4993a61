"""Vanilla decoding of B MT-bench first turns together (generate_batch, B = argv[1]) on the compiled path,
128 new tokens, two timed rounds after a warm-up, the machine held. argv[2] = "cpp": the GEMMs of every
graph chosen among inductor's C++ templates alone (gemm_kernels.CPU_TEMPLATE_ROWS raised past B; run with
EAGLESPEC_CACHE pointing at a scratch folder, since the packages' names do not say which GEMMs they hold);
anything else: the default (templates up to 8 rows, every backend above).

    EAGLESPEC_CACHE=/tmp/scratch-cache python docs/data/round-profile-zen4-s51/batch_rows16.py 16 cpp
    python docs/data/round-profile-zen4-s51/batch_rows16.py 16 default
"""
import time, sys, os
from eaglespec.engine import gemm_kernels
if sys.argv[2] == "cpp":
    gemm_kernels.CPU_TEMPLATE_ROWS = 64
from eaglespec.pause import hold_machine
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.bench.datasets import load_questions, user_message
B = int(sys.argv[1])
with hold_machine():
    g = EagleGenerator.from_pretrained(head=None)
    qs = load_questions("mt-bench", 80)
    prompts = [g.encode(messages=[{"role": "user", "content": user_message(q, 0, "mt-bench", True)}]) for q in qs][:B]
    t = time.perf_counter(); g.generate_batch(input_ids=prompts[:B], max_new_tokens=8); print("warm", time.perf_counter() - t, flush=True)
    for r in range(2):
        t = time.perf_counter()
        rs = g.generate_batch(input_ids=prompts, max_new_tokens=128)
        dt = time.perf_counter() - t
        n = sum(len(r.token_ids) for r in rs)
        print(f"{sys.argv[2]} batch {B}: {n} tokens in {dt:.1f} s: {n/dt:.1f} tok/s", flush=True)
