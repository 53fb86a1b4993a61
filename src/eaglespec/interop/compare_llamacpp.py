"""llama.cpp and eaglespec side by side on this CPU, with the same EAGLE-3 head, in one run (issue 11).

    python -m eaglespec.interop.compare_llamacpp [--limit 10] [--max-new-tokens 128] [--n-draft 3]
        [--trees chain:3,auto] [--out runs/llamacpp-compare-<time>]

Methods: llama.cpp vanilla, llama.cpp with our head as its EAGLE-3 draft (a chain of --n-draft
tokens; llama.cpp drafts chains), eaglespec vanilla and eaglespec with the same head for each tree
of --trees. Every method runs on every question through the bench harness (`bench.harness`),
interleaved question by question with the order rotated, so load from elsewhere on the machine
spreads over all of them. Prompts are the first --limit MT-bench questions through SmolLM2's chat
template, encoded once by eaglespec and sent to llama-server as token ids; greedy; tokens are
counted from generated ids for every method. llama.cpp runs the Q4_1 GGUF as is; eaglespec
dequantizes it and runs float32, so their outputs may differ while each engine's drafted output
must equal its own vanilla output. llama.cpp's time is its own (prefill + generation, from the
response's timings), eaglespec's is measured in-process, prefill included, as in `eaglespec bench`.

Writes OUT/results.json (every record, llama.cpp's counters, the machine) and OUT/results.md.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from ..bench.metrics import Record
from ..core.config import SamplingParams
from ..errors import EagleError
from .llamacpp import ENGINE, Completion, LlamaCppMethod, LlamaServer, export_llamacpp

HEAD = "smollm2-135m-instruct-eagle3"
LLAMA_VANILLA = "llama.cpp"
LLAMA_EAGLE3 = "llama.cpp+eagle3"


def _llama_row(completions: list[Completion]) -> dict:
    """llama.cpp's figures in our terms: tau = tokens after the prefill's / target forwards after
    the prefill; acceptance = accepted draft tokens / drafted ones."""
    tokens = sum(len(c.token_ids) for c in completions)
    seconds = sum(c.engine_s for c in completions)
    forwards = sum(c.decodes - 1 for c in completions)  # llama_decode calls: the prefill, then one per step
    after_prefill = sum(max(len(c.token_ids) - 1, 0) for c in completions)
    drafted, accepted = sum(c.drafted for c in completions), sum(c.accepted for c in completions)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds if seconds else 0.0,
            "tau": after_prefill / forwards if forwards else None, "drafted": drafted, "accepted": accepted,
            "acceptance": accepted / drafted if drafted else None, "steps": sum(c.steps for c in completions),
            "wall_s": sum(c.wall_s for c in completions)}


def _eagle_row(records: list[Record]) -> dict:
    tokens = sum(len(r.token_ids) for r in records)
    seconds = sum(r.elapsed for r in records)
    emitted = [e for r in records for e in (r.emitted or [])]
    accepted = sum(a for r in records for a in (r.accepted or []))
    drafted = sum(s - 1 for r in records for s in (r.tree_sizes or []))  # the root is not a draft
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds if seconds else 0.0,
            "tau": sum(emitted) / len(emitted) if emitted else None, "drafted": drafted, "accepted": accepted,
            "acceptance": accepted / drafted if drafted else None, "steps": len(emitted)}


def _fmt(x, spec=".2f", suffix="") -> str:
    return "–" if x is None else f"{x:{spec}}{suffix}"


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [f"| engine | method | tokens | time (s) | tokens/s | speedup (same engine) | tau | acceptance | "
             "output |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['engine']} | {r['method']} | {r['tokens']} | {r['seconds']:.2f} | {r['tokens_per_s']:.1f} | "
                     f"{_fmt(r['speedup'], '.2f', 'x')} | {_fmt(r['tau'])} | {_fmt(r['acceptance'], '.1%')} | "
                     f"{r['output']} |")
    m = meta
    notes = [
        "",
        f"- {m['date']}; CPU: {m['cpu']} (flags: {', '.join(m['cpu_flags']) or 'none of interest'}); "
        f"{m['threads']} threads for both engines; load average (1, 5, 15 min) {m['loadavg']['start']} at the start, "
        f"{m['loadavg']['end']} at the end",
        f"- prompts: the first {m['questions']} MT-bench questions (turn 1, chat template), "
        f"{m['max_new_tokens']} new tokens at most, greedy",
        f"- llama.cpp: {m['engine']}, target {m['target']} (Q4_1) run as is, draft {m['draft_gguf_name']} "
        f"(our head via llama.cpp's converter, f32), --spec-type draft-eagle3 --spec-draft-n-max {m['n_draft']}",
        f"- eaglespec {m['versions']['eaglespec']}: the same GGUF dequantized, float32 (torch {m['versions']['torch']}); "
        f"head {m['head']}",
        "- tau: tokens per target forward after the prefill's token; acceptance: accepted / drafted tokens; "
        "speedup: against the same engine's vanilla",
    ]
    return "\n".join(lines + notes) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eaglespec.interop.compare_llamacpp", description=__doc__.split("\n\n")[0])
    p.add_argument("--limit", type=int, default=10, help="the first N MT-bench questions (default 10)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--n-draft", type=int, default=3, help="llama.cpp's --spec-draft-n-max (default 3, its default)")
    p.add_argument("--trees", default="chain:3,auto",
                   help="eaglespec trees for the head, comma-separated (default chain:3 — llama.cpp's draft "
                        "shape — and auto, the tree tuned for this machine)")
    p.add_argument("--head", default=HEAD, help=f"an EAGLE-3 head directory or shipped name (default {HEAD})")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--no-progress", dest="progress", action="store_false")
    args = p.parse_args(argv)
    try:
        return run(args)
    except EagleError as exc:
        print(f"compare_llamacpp: error: {exc}", file=sys.stderr)
        return 2


def run(args) -> int:
    import torch

    from ..bench.cli import run_metadata
    from ..bench.datasets import load_questions
    from ..bench.harness import run_bench
    from ..bench.methods import BASELINE, build_methods
    from ..draft.shipped import head_dir_for
    from ..engine.decoding import EagleGenerator
    from ..engine.target import cpu_identity, default_gguf_path
    from .build_llamacpp import server

    binary = server()  # before minutes of loading: is llama.cpp built?
    out = args.out or Path("runs") / f"llamacpp-compare-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    head_dir = head_dir_for(args.head)
    if head_dir is None:
        raise EagleError(f"--head {args.head!r} is neither a directory nor a shipped head")
    target = default_gguf_path()
    print(f"exporting {head_dir} for llama.cpp ...", file=sys.stderr)
    draft = export_llamacpp(head_dir, out)[0]
    questions = load_questions("mt-bench", args.limit)

    load_start = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").is_file() else None
    trees = [t.strip() for t in args.trees.split(",") if t.strip()]
    gen = EagleGenerator.from_pretrained(None, str(head_dir), tree="auto" if "auto" in trees else trees[0])
    methods, _ = build_methods(gen, ",".join(["vanilla", *trees]), [], greedy=True)
    threads = torch.get_num_threads()
    with LlamaServer(target, binary=binary, threads=threads, log=out / "llama-server-vanilla.log") as plain, \
            LlamaServer(target, draft, n_draft=args.n_draft, binary=binary, threads=threads,
                        log=out / "llama-server-eagle3.log") as drafted:
        llama = [LlamaCppMethod(plain, LLAMA_VANILLA), LlamaCppMethod(drafted, LLAMA_EAGLE3)]
        methods += llama
        def encode(messages: list[dict]) -> list[int]:
            return gen.encode(messages=messages)

        first = encode([{"role": "user", "content": questions[0].turns[0]}])
        for m in methods:  # first calls pay for allocation and lazy set-up: not timed
            m.run(first, 16, SamplingParams())
        for m in llama:
            m.completions.clear()
        result = run_bench(questions, methods, encode, lambda ids: gen.decode(ids) or "",
                           max_new_tokens=args.max_new_tokens, warmup=False, progress=args.progress)

    records = {m.name: [e.record for e in result.entries if e.method == m.name] for m in methods}
    qids = [e.question_id for e in result.entries if e.method == BASELINE]
    llama_differs = [q for q, a, b in zip(qids, records[LLAMA_VANILLA], records[LLAMA_EAGLE3])
                     if a.token_ids != b.token_ids]
    engines_differ = [q for q, a, b in zip(qids, records[BASELINE], records[LLAMA_VANILLA])
                      if a.token_ids != b.token_ids]
    rows = []
    for m in methods:
        if isinstance(m, LlamaCppMethod):
            label = "vanilla" if m.name == LLAMA_VANILLA else f"EAGLE-3 (chain of {args.n_draft})"
            row = {"engine": "llama.cpp", "method": label, **_llama_row(m.completions)}
            row["output"] = ("baseline" if m.name == LLAMA_VANILLA else "= llama.cpp vanilla" if not llama_differs
                             else f"**{len(llama_differs)}/{len(qids)} differ from llama.cpp vanilla**")
        else:
            row = {"engine": "eaglespec", "method": "vanilla" if m.name == BASELINE else f"EAGLE-3, tree {m.spec}",
                   **_eagle_row(records[m.name])}
            differ = sum(1 for r, v in zip(records[m.name], records[BASELINE]) if r.token_ids != v.token_ids)
            row["output"] = "baseline" if m.name == BASELINE else ("= eaglespec vanilla" if not differ
                                                                   else f"**{differ}/{len(qids)} differ**")
        row["name"] = m.name
        rows.append(row)
    for r in rows:
        base = next(b for b in rows if b["engine"] == r["engine"] and b["output"] == "baseline")
        r["speedup"] = r["tokens_per_s"] / base["tokens_per_s"] if base["tokens_per_s"] else None

    ident = cpu_identity()
    meta = run_metadata(gen, methods, command=shlex.join(["python", "-m", __spec__.name, *sys.argv[1:]]),
                        head=args.head, questions=len(questions), max_new_tokens=args.max_new_tokens,
                        n_draft=args.n_draft, engine=ENGINE, target=target.name, draft_gguf_name=draft.name,
                        cpu=ident["cpu"], cpu_flags=ident["flags"],
                        llama_server={"vanilla": " ".join(plain.cmd), "eagle3": " ".join(drafted.cmd)})
    meta["threads"] = threads
    # llama.cpp's threads spin at barriers: load from elsewhere costs it far more than torch
    meta["loadavg"] = {"start": load_start, "end": Path("/proc/loadavg").read_text().split()[:3] if load_start else None}
    table = markdown(rows, meta)
    note = (f"- eaglespec vanilla and llama.cpp vanilla agree on {len(qids) - len(engines_differ)}/{len(qids)} "
            "questions (Q4_1 kernels against dequantized float32)\n")
    report = {"meta": meta, "rows": rows, "llama_cpp_drafted_equals_vanilla": not llama_differs,
              "llama_cpp_differs_on": llama_differs, "engines_differ_on": engines_differ,
              "eaglespec_failures": result.failures,
              "records": [{"question_id": q, "method": name, "token_ids": r.token_ids, "elapsed": r.elapsed,
                           **({"llama_cpp": vars(c)} if c is not None else {})}
                          for name in records
                          for q, r, c in zip(qids, records[name], _completions(methods, name, len(qids)))]}
    (out / "results.json").write_text(json.dumps(report, indent=2, default=str))
    (out / "results.md").write_text(table + note)
    print(table + note)
    print(f"wrote {out / 'results.json'}, {out / 'results.md'}", file=sys.stderr)
    return 1 if llama_differs or result.failures else 0


def _completions(methods, name: str, n: int) -> list:
    m = next(m for m in methods if m.name == name)
    return m.completions if isinstance(m, LlamaCppMethod) else [None] * n


if __name__ == "__main__":
    sys.exit(main())
