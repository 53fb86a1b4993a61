"""`eaglespec bench-batch`: throughput of batched EAGLE against batched vanilla decoding, by batch
size, in the spirit of the EAGLE paper's batch-size table (its speedup at batch 1-4 and its
throughput at the largest batch).

For each batch size B, the first B questions are decoded together, vanilla and EAGLE side by
side in one run (alternating, `--rounds` times, the best round of each kept against the machine's
noise). Tokens/s is the batch's: all tokens generated over the batch's wall time. Every greedy
EAGLE output is checked against the same prompt's vanilla output in that batch.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from ..errors import EagleError
from ..files import atomic_write_bytes, output_folder
from .datasets import add_dataset_arg, load_questions, user_message

DEFAULT_SIZES = "1,2,4,8,16"


def register(subparsers) -> argparse.ArgumentParser:
    from ..cli.options import add_model_args

    p = subparsers.add_parser(
        "bench-batch", help="tokens/s of batched EAGLE and vanilla decoding at several batch sizes",
        description="Decode the first B questions together, vanilla and EAGLE side by side, for each batch size B; "
                    "write results.json, results.md and batch.png. Greedy; exits 1 when an EAGLE output differs from "
                    "vanilla's.")
    add_dataset_arg(p)
    p.add_argument("--batch-sizes", default=DEFAULT_SIZES, help=f"comma-separated (default {DEFAULT_SIZES})")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds per batch size; the best of each is kept")
    p.add_argument("--out", type=Path, default=None, help="output directory (default runs/bench-batch-<timestamp>)")
    add_model_args(p)
    p.set_defaults(func=cmd_bench_batch, holds_machine=True)
    return p


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise EagleError(f"--batch-sizes {text!r}: give positive integers separated by commas, e.g. {DEFAULT_SIZES}")
    return sorted(set(sizes))


def measure(gen, prompts: list[list[int]], sizes: list[int], max_new_tokens: int, rounds: int = 2,
            progress=None) -> list[dict]:
    """-> one row per batch size: tokens/s of vanilla and EAGLE, speedup, tau, identical outputs."""
    rows = []
    for b in sizes:
        best = {}
        for r in range(rounds):
            for speculative in ((False, True) if r % 2 == 0 else (True, False)):
                start = time.perf_counter()
                results = gen.generate_batch(input_ids=prompts[:b], max_new_tokens=max_new_tokens,
                                             speculative=speculative)
                elapsed = time.perf_counter() - start
                tokens = sum(len(x.token_ids) for x in results)
                if speculative not in best or tokens / elapsed > best[speculative][0]:
                    best[speculative] = (tokens / elapsed, results, elapsed)
            if progress:
                progress(f"batch {b}: round {r + 1}/{rounds}")
        (v_tps, vanilla, v_s), (e_tps, eagle, e_s) = best[False], best[True]
        steps = [s for x in eagle for s in x.steps]
        tree = gen.tuned.tree_for(b) if gen.tuned is not None else gen.tree
        rows.append({
            "batch": b, "vanilla_tokens_per_s": round(v_tps, 2), "eagle_tokens_per_s": round(e_tps, 2),
            "speedup": round(e_tps / v_tps, 3),
            "tau": round(sum(s.emitted for s in steps) / len(steps), 3) if steps else None,
            "tree_nodes": None if tree is None else _nodes(tree),
            "identical": sum(a.token_ids == c.token_ids for a, c in zip(vanilla, eagle)), "sequences": b,
            "vanilla_s": round(v_s, 3), "eagle_s": round(e_s, 3),
        })
    return rows


def _nodes(tree) -> int:
    return tree.num_nodes - 1 if hasattr(tree, "num_nodes") else tree.total_tokens


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [f"# eaglespec bench-batch: {meta['dataset']}", "",
             f"- command: `{meta['command']}`",
             f"- model: {meta['model']}; head: {meta['head']}; tree: {meta['tree']}",
             f"- device: {meta['device_name']}; threads: {meta['threads']}; max new tokens: {meta['max_new_tokens']}; "
             f"greedy; best of {meta['rounds']} alternating rounds", "",
             "| batch | vanilla tok/s | EAGLE tok/s | speedup | tau | draft nodes | outputs identical |",
             "|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        nodes = "none" if r["tree_nodes"] is None else r["tree_nodes"]
        lines.append(f"| {r['batch']} | {r['vanilla_tokens_per_s']:.1f} | {r['eagle_tokens_per_s']:.1f} | "
                     f"{r['speedup']:.2f}x | {r['tau'] if r['tau'] is not None else '–'} | {nodes} | "
                     f"{r['identical']}/{r['sequences']} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [r["batch"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(sizes, [r["vanilla_tokens_per_s"] for r in rows], "o-", label="vanilla")
    a.plot(sizes, [r["eagle_tokens_per_s"] for r in rows], "o-", label="EAGLE")
    a.set(xscale="log", xlabel="batch size", ylabel="tokens/s (all sequences)", title="throughput")
    a.set_xticks(sizes, [str(s) for s in sizes])
    a.legend()
    b.plot(sizes, [r["speedup"] for r in rows], "o-", color="C2")
    b.axhline(1.0, color="gray", lw=0.8)
    b.set(xscale="log", xlabel="batch size", ylabel="EAGLE / vanilla", title="speedup")
    b.set_xticks(sizes, [str(s) for s in sizes])
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


def cmd_bench_batch(args) -> int:
    import platform

    import torch

    from ..cli.options import load_generator
    from ..engine.target import cpu_identity

    sizes = parse_sizes(args.batch_sizes)
    if args.max_new_tokens <= 0 or args.rounds <= 0:
        raise EagleError("--max-new-tokens and --rounds must be > 0")
    questions = load_questions(args.dataset, max(sizes))
    if len(questions) < max(sizes):
        raise EagleError(f"{args.dataset} has {len(questions)} questions: fewer than the largest batch size {max(sizes)}")
    out = output_folder(args.out or Path("runs") / f"bench-batch-{time.strftime('%Y%m%d-%H%M%S')}")  # before the work
    gen = load_generator(args, max_batch=max(sizes))
    prompts = [gen.encode(messages=[{"role": "user", "content": user_message(q, 0, args.dataset, True)}])
               for q in questions]
    rows = measure(gen, prompts, sizes, args.max_new_tokens, args.rounds,
                   progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    meta = {"command": shlex.join(["eaglespec"] + sys.argv[1:]), "dataset": args.dataset, "model": gen.target.name,
            "head": args.head, "tree": args.tree, "max_new_tokens": args.max_new_tokens, "rounds": args.rounds,
            "threads": torch.get_num_threads(), "device_name": cpu_identity().get("cpu") or platform.machine(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    text = markdown(rows, meta)
    atomic_write_bytes(out / "results.json", json.dumps({"meta": meta, "rows": rows}, indent=1).encode())
    atomic_write_bytes(out / "results.md", text.encode())
    plot(rows, out / "batch.png")
    print(text)
    print(f"wrote {out / 'results.json'}, {out / 'results.md'}, {out / 'batch.png'}", file=sys.stderr)
    if any(r["identical"] != r["sequences"] for r in rows):
        print("eaglespec bench-batch: an EAGLE output differs from vanilla's (see results.md)", file=sys.stderr)
        return 1
    return 0
