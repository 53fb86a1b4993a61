"""Where a compiled decoding step's time goes: the GEMMs, attention, inductor's fused loops between
them, the graph's own glue, and what runs outside the graph, per step, beside the memory roofline.

The step is compiled in this process with inductor's per-kernel records on
(`cpp.enable_kernel_profile`; a package on disk has none, so nothing cached is reused or touched)
and run under torch.profiler after `--context` cached tokens. Each profiler event's own time goes to
the kind of its nearest classified ancestor (an allocation inside attention is attention's). The
GEMMs' read rate is the step's weight bytes over their time: at one token, a rate near the read
bandwidth means the matrices already stream at the roofline and the rest of the step is the gap.

    python -m eaglespec.bench.profile [--target ...] [--dtype bfloat16] [--tokens 1,4] [--steps 10]
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import torch

KINDS = ("GEMMs", "attention", "fused loops", "graph glue", "outside the graph")
_GLUE = ("Torch-Compiled Region", "CompiledFxGraph", "TorchDynamo", "AOTDispatcher", "Pregraph")
_GEMMS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "aten::matmul")


def kind_of(name: str) -> str | None:
    """The kind an event of this name is, or None (it takes its parent's)."""
    if "cpp_fused" in name:  # an inductor loop, even one named after the SDPA it prepares
        return "fused loops"
    if "gemm" in name or name.startswith("mkldnn::") or name.startswith("mkl::") or name in _GEMMS:
        return "GEMMs"
    if "scaled_dot_product" in name:
        return "attention"
    if any(g in name for g in _GLUE):
        return "graph glue"
    return None


def breakdown(events) -> tuple[dict, Counter]:
    """({kind: self µs}, {kernel name: self µs}) over torch.profiler's function events."""
    kinds, kernels = dict.fromkeys(KINDS, 0.0), Counter()
    for ev in events:
        e, kind = ev, None
        while e is not None and kind is None:
            kind, e = kind_of(e.name), e.cpu_parent
        kinds[kind or "outside the graph"] += ev.self_cpu_time_total
        kernels[ev.name] += ev.self_cpu_time_total
    return kinds, kernels


@torch.no_grad()
def profile_steps(target, steps, tokens: list[int], context: int = 256, n: int = 10) -> dict:
    """{q: (wall seconds a step unprofiled (median), {kind: seconds a step}, {kernel: seconds a
    step})} for q-token chain steps after `context` cached tokens on `steps` (target.EagerSteps'
    interface)."""
    from torch.profiler import ProfilerActivity, profile

    from .roofline import interleaved_medians

    g = torch.Generator().manual_seed(0)
    cache = target.new_cache()
    target.forward(torch.randint(0, target.vocab_size, (1, context), generator=g), cache)
    rows = steps.start_rows(cache, [context], context + max(tokens))

    def run(q):
        ids = torch.randint(0, target.vocab_size, (1, q), generator=g)
        mask = torch.ones(q, q, dtype=torch.bool).tril()[None]
        steps.verify_rows(ids, rows, mask, torch.arange(q)[None], [q])
        rows.crop(context)

    wall = interleaved_medians(tokens, run, rounds=n)  # builds every graph first
    out = {}
    for q in tokens:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(n):
                run(q)
        kinds, kernels = breakdown(prof.events())
        out[q] = (wall[q], {k: v / 1e6 / n for k, v in kinds.items()}, {k: v / 1e6 / n for k, v in kernels.items()})
    return out


def main(argv: list[str] | None = None) -> int:
    import torch._inductor.config as inductor_config

    from ..engine.compiled import CompiledSteps, compile_mode, resolve_mode
    from ..engine.numerics import DTYPES, check_dtype_runs
    from ..engine.target import load_target
    from ..pause import hold_machine
    from .roofline import READ, step_times, weight_bytes

    p = argparse.ArgumentParser(prog="python -m eaglespec.bench.profile", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default=None)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--tokens", default="1,4", help="query sizes to profile (1 = a vanilla step)")
    p.add_argument("--context", type=int, default=256, help="cached tokens before each step")
    p.add_argument("--steps", type=int, default=10, help="steps profiled (and timed unprofiled) per size")
    p.add_argument("--top", type=int, default=10, help="kernels listed by their time at the first size")
    args = p.parse_args(argv)
    try:
        tokens = [int(x) for x in args.tokens.split(",")]
    except ValueError:
        tokens = []
    if not tokens or min(tokens) < 1 or args.context < 1 or args.steps < 1:
        raise SystemExit(f"--tokens {args.tokens!r} / --context {args.context} / --steps {args.steps}: "
                         "give positive numbers")
    check_dtype_runs(args.dtype, "cpu")
    target = load_target(args.target, DTYPES[args.dtype])
    on, why = resolve_mode(compile_mode("on"), target.device)
    if not on:
        raise SystemExit(f"no compiled step to profile: {why}")
    inductor_config.cpp.enable_kernel_profile = True  # this process's graphs only: none is saved
    steps = CompiledSteps(target)  # in-process graphs: a few minutes each with max-autotune
    size = weight_bytes(target)
    with hold_machine():  # a background capture or training run sleeps meanwhile
        floor = step_times(target, {}, [], rounds=args.steps, read_bytes=size)[READ]
        result = profile_steps(target, steps, tokens, args.context, args.steps)
    print(f"weights read per step: {size / 1e6:.0f} MB; read bandwidth: {size / floor / 1e9:.1f} GB/s "
          f"({torch.get_num_threads()} threads); roofline: {floor * 1e3:.1f} ms a step; "
          f"{args.context} cached tokens, {args.steps} steps a size")
    print("ms a step    wall (unprofiled)  " + "  ".join(f"{k:>{max(len(k), 6)}s}" for k in KINDS) + "  GEMM read GB/s")
    for q, (wall, kinds, _) in result.items():
        cells = "  ".join(f"{kinds[k] * 1e3:>{max(len(k), 6)}.2f}" for k in KINDS)
        print(f"q = {q:<8d} {wall * 1e3:17.2f}  {cells}  {size / kinds['GEMMs'] / 1e9 if kinds['GEMMs'] else 0:14.1f}")
    q = tokens[0]
    print(f"the {args.top} dearest kernels and ops at q = {q}, ms a step:")
    for name, s in Counter(result[q][2]).most_common(args.top):
        print(f"  {s * 1e3:7.3f}  {(kind_of(name) or '-'):12s} {name[:100]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
