"""The memory roofline of one decoding step, and how close each path runs to it.

A single-token step of a small model is bound by reading its weights: every matrix of the decoder
and the LM head once (the embedding only one row). The floor is the time to stream that many
bytes, measured here as torch's own reduction over a buffer of the same size (far larger than the
caches), on the same threads. The read, each path's vanilla step (eager, compiled) and its
verification steps are timed in shuffled interleaved rounds in one process (medians), as the cost
curve is, so that a machine shared with other work slows all of them alike.

    python -m eaglespec.bench.roofline [--target ...] [--dtype bfloat16] [--compile on] [--tokens 1,2,4,8]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch


def weight_bytes(target) -> int:
    """Bytes a single-token step reads: every decoder matrix and vector, the LM head, one
    embedding row (a tied LM head is the embedding itself, counted once)."""
    seen, total = set(), 0
    for p in list(target.decoder.parameters()) + list(target.lm_head.parameters()):
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        total += p.numel() * p.element_size()
    embed = target.embed_tokens.weight
    if embed.data_ptr() not in {p.data_ptr() for p in target.lm_head.parameters()}:
        total -= embed.numel() * embed.element_size() - embed.shape[1] * embed.element_size()
    return total


READ = ("read", 0)  # the case of step_times that streams the weights' bytes


def chain_steps(target, steps: dict, tokens: list[int], context: int = 256, seed: int = 0):
    """run(name, q): a q-token chain verification step (q = 1: a vanilla step) on steps[name]
    (target.EagerSteps' interface) after `context` random cached tokens, rolled back after."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, target.vocab_size, (1, context), generator=g)
    rows = {}
    for name, backend in steps.items():
        cache = target.new_cache()
        target.forward(prompt, cache)
        rows[name] = backend.start_rows(cache, [context], context + max(tokens))

    def run(name, q):
        ids = torch.randint(0, target.vocab_size, (1, q), generator=g)
        mask = torch.ones(q, q, dtype=torch.bool).tril()[None]
        steps[name].verify_rows(ids, rows[name], mask, torch.arange(q)[None], [q])
        rows[name].crop(context)

    return run


@torch.no_grad()
def step_times(target, steps: dict, tokens: list[int], context: int = 256, rounds: int = 9,
               read_bytes: int = 0) -> dict:
    """{(path, q): median seconds} of q-token chain verification steps (q = 1: a vanilla step)
    after `context` cached tokens, every path and size interleaved in shuffled rounds; with
    read_bytes, also READ: torch's sum over a buffer of that many bytes (fp32)."""
    step = chain_steps(target, steps, tokens, context) if steps else None
    cases = [(name, q) for name in steps for q in tokens] + ([READ] if read_bytes else [])
    buffer = torch.ones(read_bytes // 4) if read_bytes else None

    def run(name, q):
        if (name, q) == READ:
            buffer.sum()
        else:
            step(name, q)

    return interleaved_medians(cases, lambda case: run(*case), rounds)


def sizes(text: str, option: str = "--tokens") -> list[int]:
    """'1,2,4' -> [1, 2, 4]; anything else, or a size under 1, a one-line SystemExit."""
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise SystemExit(f"{option} {text!r}: give positive whole numbers separated by commas, e.g. {option} 1,4")
    return out


def machine_line(dtype: str) -> str:
    """The CPU, its matrix flags, threads and dtype: what a printed timing was measured on."""
    from ..engine.target import cpu_identity

    ident = cpu_identity()
    return f"{ident['cpu']} ({' '.join(ident.get('flags', [])) or 'no matrix flags'}), {torch.get_num_threads()} threads, {dtype}"


def interleaved_medians(cases: list, run, rounds: int) -> dict:
    """{case: median seconds of run(case)}: every case run once to warm (and build graphs), then
    `rounds` rounds, each over all cases in a shuffled order, so that a machine shared with other
    work slows them alike."""
    cases, times = list(cases), {case: [] for case in cases}
    for case in cases:
        run(case)
    order = random.Random(0)
    for _ in range(rounds):
        order.shuffle(cases)
        for case in cases:
            t = time.perf_counter()
            run(case)
            times[case].append(time.perf_counter() - t)
    return {case: statistics.median(ts) for case, ts in times.items()}


def main(argv: list[str] | None = None) -> int:
    from ..engine.compiled import CompiledSteps, artefact_dir, compile_mode, resolve_mode
    from ..engine.numerics import DTYPES, check_dtype_runs
    from ..engine.target import EagerSteps, load_target
    from ..errors import EagleError
    from ..pause import hold_machine

    p = argparse.ArgumentParser(prog="python -m eaglespec.bench.roofline", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default=None)
    p.add_argument("--compile", default="auto", choices=["auto", "on", "off"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="the weights' dtype (bfloat16: on a CPU with native bf16 units; half the bytes)")
    p.add_argument("--tokens", default="1,2,4,8", help="query sizes to time (1 = a vanilla step)")
    p.add_argument("--rounds", type=int, default=9)
    args = p.parse_args(argv)
    tokens = sizes(args.tokens)
    if args.rounds < 1:
        raise SystemExit(f"--rounds {args.rounds}: give at least 1")
    try:
        check_dtype_runs(args.dtype, "cpu")
        target = load_target(args.target, DTYPES[args.dtype])
    except EagleError as exc:
        raise SystemExit(str(exc))
    steps = {"eager": EagerSteps(target)}
    on, why = resolve_mode(compile_mode(args.compile), target.device)
    if on:
        steps["compiled"] = CompiledSteps(target, folder=artefact_dir(target)[0])
    size = weight_bytes(target)
    with hold_machine():  # a background capture or training run sleeps meanwhile
        times = step_times(target, steps, tokens, rounds=args.rounds, read_bytes=size)
    floor = times[READ]
    bandwidth = size / floor
    print(machine_line(args.dtype))
    print(f"weights read per step: {size / 1e6:.0f} MB; read bandwidth: {bandwidth / 1e9:.1f} GB/s; "
          f"roofline: {floor * 1e3:.1f} ms a step")
    print(f"{'path':9s}" + "".join(f"  q={q:<3d} ms" for q in tokens) + "  roofline/q=1  cost(q)/cost(1)")
    for name in steps:
        one = times[(name, 1)] if 1 in tokens else None
        cells = "".join(f"  {times[(name, q)] * 1e3:8.1f}" for q in tokens)
        ratios = " ".join(f"{times[(name, q)] / one:.2f}" for q in tokens) if one else ""
        print(f"{name:9s}{cells}  {floor / one if one else float('nan'):11.2f}  {ratios}")
    if not on:
        print(f"(no compiled row: {why})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
