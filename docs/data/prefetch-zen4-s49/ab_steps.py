"""The whole SmolLM2-135M step with packages of different fp32 micro-GEMM blocks, loaded in one
process and timed in shuffled interleaved rounds (bench.roofline.step_times). First build each
folder, in its own process, with the block it is to hold (rows, and k-rows of weights prefetched
ahead; 0: none):
    python ab_steps.py build FOLDER ROWS PREFETCH
then time them side by side:
    python ab_steps.py time NAME=FOLDER NAME=FOLDER ... [--rounds 11]
A folder made by eaglespec itself (~/.cache/eaglespec/compiled/<key>) can be timed as it is."""
import sys
from pathlib import Path

import torch

from eaglespec.bench.roofline import READ, step_times, weight_bytes
from eaglespec.engine import gemm_kernels
from eaglespec.engine.compiled import CompiledSteps
from eaglespec.engine.gemm_kernels import GemmBlock
from eaglespec.engine.target import load_target
from eaglespec.pause import hold_machine

TOKENS = [1, 2, 4, 8]
target = load_target(None, torch.float32)
if sys.argv[1] == "build":
    folder, rows, prefetch = Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    folder.mkdir(parents=True, exist_ok=True)
    gemm_kernels.cpu_gemm_block = lambda: GemmBlock(rows, prefetch)
    step_times(target, {"build": CompiledSteps(target, folder=folder)}, TOKENS, rounds=1)
    print(f"built {folder} with {GemmBlock(rows, prefetch)}")
else:
    args = [a for a in sys.argv[2:] if "=" in a]
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 11
    steps = {name: CompiledSteps(target, folder=Path(folder)) for name, folder in (a.split("=", 1) for a in args)}
    with hold_machine():
        times = step_times(target, steps, TOKENS, rounds=rounds, read_bytes=weight_bytes(target))
    print(f"read of {weight_bytes(target) / 1e6:.0f} MB: {times[READ] * 1e3:.1f} ms")
    for name in steps:
        one = times[(name, 1)]
        print(f"{name:8s}" + "".join(f"  q={q}: {times[(name, q)] * 1e3:5.1f}" for q in TOKENS)
              + "   C(q)/C(1) " + " ".join(f"{times[(name, q)] / one:.2f}" for q in TOKENS))
