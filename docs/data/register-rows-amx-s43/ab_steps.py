"""The whole SmolLM2-135M step, packages built with 4-row and with 2-row fp32 micro-GEMM blocks,
loaded in one process and timed in shuffled interleaved rounds (bench.roofline.step_times):
    python ab_steps.py OLD_FOLDER NEW_FOLDER [rounds]
The folders are ~/.cache/eaglespec/compiled/<key> of each build (the 4-row one made before the change)."""
import sys
from pathlib import Path

import torch

from eaglespec.bench.roofline import READ, step_times, weight_bytes
from eaglespec.engine.compiled import CompiledSteps
from eaglespec.engine.target import load_target
from eaglespec.pause import hold_machine

old, new = sys.argv[1], sys.argv[2]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 11
target = load_target(None, torch.float32)
steps = {"rows4": CompiledSteps(target, folder=Path(old)), "rows2": CompiledSteps(target, folder=Path(new))}
tokens = [1, 2, 4, 8]
with hold_machine():
    times = step_times(target, steps, tokens, rounds=rounds, read_bytes=weight_bytes(target))
print(f"read of {weight_bytes(target) / 1e6:.0f} MB: {times[READ] * 1e3:.1f} ms")
for name in steps:
    one = times[(name, 1)]
    print(f"{name:6s}" + "".join(f"  q={q}: {times[(name, q)] * 1e3:5.1f}" for q in tokens)
          + "   C(q)/C(1) " + " ".join(f"{times[(name, q)] / one:.2f}" for q in tokens))
