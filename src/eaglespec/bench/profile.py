"""Where a compiled decoding step's time goes: the GEMMs, attention, inductor's fused loops between
them, the graph's own glue, and what runs outside the graph, per step, beside the memory roofline.

The step is compiled in this process with inductor's per-kernel records on
(`cpp.enable_kernel_profile`; a package on disk has none, so nothing cached is reused or touched).
The unprofiled step times and the weights' read are taken side by side in shuffled rounds (as the
roofline command does), then every size runs again, in shuffled rounds, under one torch.profiler
session, each step marked with its size. Each profiler event's own time goes to its step's size and
to the kind of its nearest classified ancestor (an allocation inside attention is attention's). The
GEMMs' read rate is the step's weight bytes over their time: at one token, a rate near the read
bandwidth means the matrices already stream at the roofline and the rest of the step is the gap.

    python -m eaglespec.bench.profile [--target ...] [--dtype bfloat16] [--tokens 1,4] [--rounds 10]
"""

from __future__ import annotations

import argparse
import random
from collections import Counter
from dataclasses import dataclass

import torch

KINDS = ("GEMMs", "attention", "fused loops", "graph glue", "outside the graph")
_GLUE = ("Torch-Compiled Region", "CompiledFxGraph", "TorchDynamo", "AOTDispatcher", "Pregraph")
_GEMMS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "aten::matmul")
_MARK = "eaglespec step q="  # the record_function around each profiled step


def kind_of(name: str) -> str | None:
    """The kind an event of this name is, or None (it takes its parent's). The names are those of
    an in-process graph (`graph_N_gemm_...` templates, `graph_N_cpp_fused_...` loops); inductor's
    C++-wrapper mode names GEMMs `..._cpp_fused_mm_N`, which would count as loops, and is not used."""
    if "cpp_fused" in name:  # an inductor loop, even one named after the SDPA it prepares
        return "fused loops"
    if "gemm" in name or name.startswith("mkldnn::") or name.startswith("mkl::") or name in _GEMMS:
        return "GEMMs"
    if "scaled_dot_product" in name:
        return "attention"
    if any(g in name for g in _GLUE):
        return "graph glue"
    return None


def breakdown(events) -> dict[int, tuple[dict, Counter]]:
    """{q: ({kind: own µs}, {event name: own µs})} over torch.profiler's function events, each
    event counted under the size of the `_MARK` record it ran in (events outside any are left out;
    the record's own time, Python between the ops, is outside the graph)."""
    out: dict[int, tuple[dict, Counter]] = {}
    for ev in events:
        kind, q, e = None, None, ev
        while e is not None and q is None:
            kind = kind or kind_of(e.name)
            if e.name.startswith(_MARK):
                q = int(e.name[len(_MARK):])
            e = e.cpu_parent
        if q is None:
            continue
        kinds, names = out.setdefault(q, (dict.fromkeys(KINDS, 0.0), Counter()))
        kinds[kind or "outside the graph"] += ev.self_cpu_time_total
        names[ev.name] += ev.self_cpu_time_total
    return out


@dataclass(frozen=True)
class StepProfile:
    wall: float              # seconds a step, unprofiled (median of the shuffled rounds)
    kinds: dict[str, float]  # seconds a step of each of KINDS, profiled
    names: dict[str, float]  # seconds a step of each kernel or op, profiled


@torch.no_grad()
def profile_steps(target, backend, tokens: list[int], context: int = 256, rounds: int = 10,
                  read_bytes: int = 0) -> tuple[dict[int, StepProfile], float | None]:
    """({q: StepProfile} of q-token chain steps (q = 1: a vanilla step) on `backend`
    (target.EagerSteps' interface) after `context` cached tokens, seconds of reading read_bytes
    (None without), the read and the unprofiled steps timed side by side)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from .roofline import READ, chain_steps, step_times

    times = step_times(target, {"step": backend}, tokens, context, rounds, read_bytes)  # builds every graph
    run = chain_steps(target, {"step": backend}, tokens, context)
    order, cases = random.Random(1), list(tokens) * rounds
    order.shuffle(cases)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for q in cases:
            with record_function(f"{_MARK}{q}"):
                run("step", q)
    found = breakdown(prof.events())
    out = {}
    for q in tokens:
        kinds, names = found.get(q, (dict.fromkeys(KINDS, 0.0), Counter()))
        out[q] = StepProfile(times[("step", q)], {k: v / 1e6 / rounds for k, v in kinds.items()},
                             {k: v / 1e6 / rounds for k, v in names.items()})
    return out, times.get(READ)


def main(argv: list[str] | None = None) -> int:
    import torch._inductor.config as inductor_config

    from ..engine.compiled import QUERY_BUCKETS, CompiledSteps, compile_mode, resolve_mode
    from ..engine.numerics import DTYPES, check_dtype_runs
    from ..engine.target import load_target
    from ..errors import EagleError
    from ..pause import hold_machine
    from .roofline import machine_line, sizes, weight_bytes

    p = argparse.ArgumentParser(prog="python -m eaglespec.bench.profile", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default=None)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--tokens", default="1,4", help=f"query sizes to profile, among {QUERY_BUCKETS} (1 = a vanilla step)")
    p.add_argument("--context", type=int, default=256, help="cached tokens before each step")
    p.add_argument("--rounds", type=int, default=10, help="steps of each size timed, and profiled")
    p.add_argument("--top", type=int, default=10, help="kernels and ops listed, dearest first, at the first size")
    args = p.parse_args(argv)
    tokens = sizes(args.tokens)
    if set(tokens) - set(QUERY_BUCKETS):
        raise SystemExit(f"--tokens {args.tokens!r}: a compiled step runs {QUERY_BUCKETS} tokens (others are "
                         "padded to the next); give sizes among those")
    if args.context < 1 or args.rounds < 1 or args.top < 0:
        raise SystemExit(f"--context {args.context} / --rounds {args.rounds} / --top {args.top}: give at least 1 "
                         "(--top: at least 0)")
    try:
        check_dtype_runs(args.dtype, "cpu")
        target = load_target(args.target, DTYPES[args.dtype])
    except EagleError as exc:
        raise SystemExit(str(exc))
    on, why = resolve_mode(compile_mode("on"), target.device)
    if not on:
        raise SystemExit(f"no compiled step to profile: {why}")
    inductor_config.cpp.enable_kernel_profile = True  # this process's graphs only: none is saved
    backend = CompiledSteps(target)  # in-process graphs: a few minutes each with max-autotune
    size = weight_bytes(target)
    with hold_machine():  # a background capture or training run sleeps meanwhile
        result, floor = profile_steps(target, backend, tokens, args.context, args.rounds, read_bytes=size)
    print(machine_line(args.dtype))
    print(f"weights read per step: {size / 1e6:.0f} MB; read bandwidth: {size / floor / 1e9:.1f} GB/s; "
          f"roofline: {floor * 1e3:.1f} ms a step; {args.context} cached tokens, {args.rounds} steps a size")
    widths = [max(len(k), 6) for k in KINDS]
    print(f"{'ms a step':12s} {'wall (unprofiled)':>17s}  " + "  ".join(f"{k:>{w}s}" for k, w in zip(KINDS, widths))
          + "  GEMM read GB/s")
    for q, r in result.items():
        cells = "  ".join(f"{r.kinds[k] * 1e3:>{w}.2f}" for k, w in zip(KINDS, widths))
        rate = size / r.kinds["GEMMs"] / 1e9 if r.kinds["GEMMs"] else 0.0
        print(f"{f'q = {q}':12s} {r.wall * 1e3:17.2f}  {cells}  {rate:14.1f}")
    if args.top:
        print(f"the {args.top} dearest kernels and ops at q = {tokens[0]}, ms a step:")
        for name, s in Counter(result[tokens[0]].names).most_common(args.top):
            print(f"  {s * 1e3:7.3f}  {(kind_of(name) or '-'):12s} {name[:100]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
