"""One table, one run: vanilla and EAGLE for each numeric format the machine offers (fp32, bf16
where the CPU has native units or on CUDA, weight-only int8), on the same prompts, interleaved
prompt by prompt, with llama.cpp's vanilla decoding of the GGUF the default model ships as (Q4_1)
when llama.cpp has been built (`python -m eaglespec.interop.build_llamacpp`). Each EAGLE output is compared with the same format's vanilla output (its own
verifier); speedups are over fp32 vanilla.

    python -m eaglespec.bench.dtypes --limit 10 --max-new-tokens 128 --out runs/bench-dtypes
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from ..errors import EagleError


def formats(device: str) -> list[tuple[str, str, str | None]]:
    """-> (label, dtype, quantization) rows this machine can run."""
    from ..engine.target import native_bf16_cpu

    rows = [("fp32", "float32", None)]
    if device.startswith("cuda") or native_bf16_cpu():
        rows.append(("bf16", "bfloat16", None))
    rows.append(("int8 weight-only (fp32 compute)", "float32", "int8"))
    return rows


def run(prompts: list[list[int]], gens: dict, max_new_tokens: int, progress=None, llamacpp=None) -> list[dict]:
    """gens: label -> EagleGenerator. Interleaved: for each prompt, every format's vanilla then
    EAGLE, then llama.cpp's vanilla when `llamacpp` (a running interop.llamacpp.LlamaServer) is given."""
    totals = {label: {"vanilla": [0, 0.0], "eagle": [0, 0.0], "steps": [], "identical": 0} for label in gens}
    other = [0, 0.0]
    for i, ids in enumerate(prompts):
        if llamacpp is not None:
            c = llamacpp.complete(ids, max_new_tokens)
            other[0] += len(c.token_ids)
            other[1] += c.wall_s
        for label, gen in gens.items():
            out = {}
            for mode in ("vanilla", "eagle"):
                start = time.perf_counter()
                r = gen.generate(input_ids=ids, max_new_tokens=max_new_tokens, speculative=mode == "eagle")
                elapsed = time.perf_counter() - start
                totals[label][mode][0] += len(r.token_ids)
                totals[label][mode][1] += elapsed
                out[mode] = r
            totals[label]["steps"] += [s.emitted for s in out["eagle"].steps]
            totals[label]["identical"] += out["eagle"].token_ids == out["vanilla"].token_ids
        if progress:
            progress(f"prompt {i + 1}/{len(prompts)}")
    base = totals[next(iter(gens))]["vanilla"]
    base_tps = base[0] / base[1]
    rows = []
    for label, t in totals.items():
        for mode in ("vanilla", "eagle"):
            tokens, seconds = t[mode]
            rows.append({"format": label, "method": mode, "tokens_per_s": round(tokens / seconds, 2),
                         "speedup_vs_fp32_vanilla": round(tokens / seconds / base_tps, 3),
                         "tau": round(sum(t["steps"]) / len(t["steps"]), 3) if mode == "eagle" and t["steps"] else 1.0,
                         "identical": f"{t['identical']}/{len(prompts)}" if mode == "eagle" else "baseline"})
    if llamacpp is not None:
        rows.append({"format": f"llama.cpp {llamacpp.model.name.rsplit('.', 2)[-2]} (its own kernels)",
                     "method": "vanilla", "tokens_per_s": round(other[0] / other[1], 2),
                     "speedup_vs_fp32_vanilla": round(other[0] / other[1] / base_tps, 3), "tau": 1.0,
                     "identical": "another engine"})
    return rows


def _tree_line(gen) -> str:
    if gen.tuned is not None:
        return gen.tuned.describe().splitlines()[0]
    tree = gen.tree
    return "no tree" if tree is None else (f"{tree.num_nodes - 1} draft nodes {[list(p) for p in tree.paths]}"
                                           if hasattr(tree, "paths") else str(tree))


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [f"- command: `{meta['command']}`", f"- machine: {meta['cpu']}; threads: {meta['threads']}; "
             f"prompts: {meta['prompts']} (MT-bench first turns); max new tokens: {meta['max_new_tokens']}; greedy",
             "", "| format | method | tokens/s | speedup vs fp32 vanilla | tau | identical to its own vanilla |",
             "|---|---|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['format']} | {r['method']} | {r['tokens_per_s']:.1f} | {r['speedup_vs_fp32_vanilla']:.2f}x | "
                     f"{r['tau']:.2f} | {r['identical']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from ..engine.decoding import EagleGenerator
    from ..engine.target import cpu_identity
    from ..files import atomic_write_bytes
    from .datasets import MT_BENCH, load_questions

    p = argparse.ArgumentParser(prog="python -m eaglespec.bench.dtypes", description=__doc__.split("\n\n")[0])
    p.add_argument("--limit", type=int, default=10)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--head", default="default")
    p.add_argument("--tree", default="auto")
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-llamacpp", dest="llamacpp", action="store_false",
                   help="skip the llama.cpp row (it needs `python -m eaglespec.interop.build_llamacpp` first)")
    p.add_argument("--out", type=Path, default=Path("runs") / f"bench-dtypes-{time.strftime('%Y%m%d-%H%M%S')}")
    args = p.parse_args(argv)
    gens = {}
    for label, dtype, quantize in formats(args.device):
        gens[label] = EagleGenerator.from_pretrained(None, args.head, args.tree, device=args.device, dtype=dtype,
                                                     quantize=quantize)
        print(f"{label}: {_tree_line(gens[label])}", file=sys.stderr, flush=True)
    first = next(iter(gens.values()))
    prompts = [first.encode(messages=[{"role": "user", "content": q.turns[0]}])
               for q in load_questions(MT_BENCH, args.limit)]
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    try:
        from ..engine.target import default_gguf_path
        from ..interop.build_llamacpp import server
        from ..interop.llamacpp import LlamaServer

        llama = LlamaServer(default_gguf_path(), binary=server()) if args.llamacpp else None
        if llama is not None:  # an idle llama.cpp spins on its cores by default: it would slow our rows
            llama.cmd += ["--poll", "0"]
    except EagleError as exc:
        say(f"note: no llama.cpp row ({exc})")
        llama = None
    if llama is None:
        rows = run(prompts, gens, args.max_new_tokens, progress=say)
    else:
        with llama:
            rows = run(prompts, gens, args.max_new_tokens, progress=say, llamacpp=llama)
    meta = {"command": "python -m eaglespec.bench.dtypes " + " ".join(argv if argv is not None else sys.argv[1:]),
            "cpu": cpu_identity()["cpu"], "threads": torch.get_num_threads(), "prompts": len(prompts),
            "max_new_tokens": args.max_new_tokens,
            "trees": {label: _tree_line(g) for label, g in gens.items()}}
    args.out.mkdir(parents=True, exist_ok=True)
    text = markdown(rows, meta)
    atomic_write_bytes(args.out / "results.json", json.dumps({"meta": meta, "rows": rows}, indent=1).encode())
    atomic_write_bytes(args.out / "results.md", text.encode())
    print(text)
    return 0 if all(r["identical"] in ("baseline", f"{len(prompts)}/{len(prompts)}") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
