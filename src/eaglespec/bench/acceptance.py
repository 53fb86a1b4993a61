"""Acceptance of a head on a whole benchmark, fast: tau and n-alpha with given trees, decoded in
batches (`python -m eaglespec.bench.acceptance`).

`eaglespec bench` decodes one prompt at a time, which is what speed is measured on; on a CPU its
80 MT-bench questions take an hour or more per method. Acceptance does not depend on timing, and
the batched loop verifies every row with the same tree as a batch of one, so decoding B prompts
together gives the same accepted lengths several times faster (`Batch` is tested to emit each
sequence's tokens as it would alone). Every EAGLE output is still checked against vanilla
decoding of the same prompt, batched the same way. No speed is reported here: speedups come from
`eaglespec bench`, side by side.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from ..errors import EagleError
from ..files import atomic_write_bytes
from .datasets import add_dataset_arg, load_questions, user_message
from .metrics import n_alpha, tau

DEPTHS = 4


def measure(gen, prompts: list[list[int]], trees: list[str], batch: int, max_new_tokens: int,
            progress=None) -> tuple[list[dict], int]:
    """-> (one row per tree: tau, n-alpha at depths 1..DEPTHS, outputs identical to vanilla;
    the number of tokens vanilla decoding generated)."""
    vanilla: list[list[int]] = []
    steps: dict[str, list] = {t: [] for t in trees}
    identical = dict.fromkeys(trees, 0)
    for start in range(0, len(prompts), batch):
        group = prompts[start:start + batch]
        base = gen.generate_batch(input_ids=group, max_new_tokens=max_new_tokens, speculative=False)
        vanilla += [r.token_ids for r in base]
        for tree in trees:
            results = gen.generate_batch(input_ids=group, max_new_tokens=max_new_tokens, tree=tree)
            steps[tree] += [s for r in results for s in r.steps]
            identical[tree] += sum(r.token_ids == b.token_ids for r, b in zip(results, base))
        if progress:
            progress(f"{min(start + batch, len(prompts))}/{len(prompts)} prompts")
    rows = []
    for tree in trees:
        accepted = [s.accepted for s in steps[tree]]
        rows.append({"tree": tree, "tau": round(tau(s.emitted for s in steps[tree]), 3), "steps": len(accepted),
                     "n_alpha": [None if a is None else round(a, 3) for a in n_alpha(accepted, DEPTHS)],
                     "identical": identical[tree], "prompts": len(prompts)})
    return rows, sum(map(len, vanilla))


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [f"# acceptance: {meta['head']} on {meta['dataset']} ({meta['prompts']} prompts)", "",
             f"- command: `{meta['command']}`",
             f"- greedy, {meta['max_new_tokens']} new tokens, decoded {meta['batch']} prompts at a time; "
             f"vanilla: {meta['vanilla_tokens']} tokens", "",
             "| tree | tau | n-alpha, n = 1..4 | verification steps | outputs identical |", "|---|---:|---|---:|---|"]
    for r in rows:
        alphas = ", ".join("-" if a is None else f"{a:.2f}" for a in r["n_alpha"])
        lines.append(f"| `{r['tree']}` | {r['tau']:.2f} | {alphas} | {r['steps']} | {r['identical']}/{r['prompts']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from ..cli.options import add_model_args, load_generator

    p = argparse.ArgumentParser(prog="python -m eaglespec.bench.acceptance", description=__doc__.split("\n\n")[0])
    add_dataset_arg(p)
    p.add_argument("--limit", type=int, default=None, help="the first N questions only (default: all)")
    p.add_argument("--trees", default="eagle1", help="trees separated by ';', e.g. 'eagle1;dynamic:4,4,12' (default eagle1)")
    p.add_argument("--batch", type=int, default=16, help="prompts decoded together (default 16)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--out", type=Path, required=True, help="output directory: results.json, results.md")
    add_model_args(p)
    args = p.parse_args(argv)
    try:
        if args.batch < 1 or args.max_new_tokens < 1:
            raise EagleError("--batch and --max-new-tokens must be 1 or more")
        trees = [t.strip() for t in args.trees.split(";") if t.strip()]
        if not trees or "auto" in trees:
            raise EagleError("--trees: give fixed trees such as 'eagle1;dynamic' (auto depends on the batch size)")
        questions = load_questions(args.dataset, args.limit)
        args.tree = trees[0]  # fixed trees: nothing to tune
        gen = load_generator(args, max_batch=args.batch)
        prompts = [gen.encode(messages=[{"role": "user", "content": user_message(q, 0, args.dataset, True)}])
                   for q in questions]
        started = time.perf_counter()
        rows, vanilla_tokens = measure(gen, prompts, trees, args.batch, args.max_new_tokens,
                       progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    except EagleError as exc:
        p.exit(2, f"{p.prog}: error: {exc}\n")
    given = sys.argv[1:] if argv is None else list(argv)  # called by another job (scaling): its own arguments
    meta = {"command": shlex.join(["python", "-m", "eaglespec.bench.acceptance"] + given),
            "dataset": args.dataset, "head": args.head, "prompts": len(prompts), "batch": args.batch,
            "max_new_tokens": args.max_new_tokens, "minutes": round((time.perf_counter() - started) / 60, 1),
            "vanilla_tokens": vanilla_tokens, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    args.out.mkdir(parents=True, exist_ok=True)
    text = markdown(rows, meta)
    atomic_write_bytes(args.out / "results.json", json.dumps({"meta": meta, "rows": rows}, indent=1).encode())
    atomic_write_bytes(args.out / "results.md", text.encode())
    print(text)
    if any(r["identical"] != r["prompts"] for r in rows):
        print("an EAGLE output differs from vanilla's (see results.md)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
