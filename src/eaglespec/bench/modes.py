"""`eaglespec bench-modes`: the two sampling modes side by side (issue 21's measurement): for each
sampling setting (temperature x top-p), every method in both modes, interleaved question by question
in one run: acceptance, tau and tokens/s, as one table (modes.md, modes.json).

Modes (SamplingParams.mode): speculative, EAGLE's multi-round speculative sampling (acceptance up to
1 - TV(p, q)); reproducible, greedy verification against the target perturbed by keyed Gumbel
noise (the seeded vanilla sample, token for token). Vanilla runs in each mode too: it is the
speedup's baseline for that mode (the noise has a cost of its own), and in the reproducible mode
every EAGLE output must equal its ids (the column `= vanilla`). A prompt's seed is seed + its index,
the same for every method. Each setting keeps its own journal in OUT/t<T>-p<P>/, so an
interrupted run resumes.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

from ..core.config import REPRODUCIBLE, SAMPLING_MODES, SPECULATIVE, SamplingParams
from ..errors import EagleError
from ..files import atomic_write_bytes, output_folder
from .datasets import add_dataset_arg
from .methods import BASELINE, LoopMethod, build_methods, method_names

DEFAULTS = {"temperature": "0.7,1.0", "top_p": "0.9,1.0", "modes": f"{SPECULATIVE},{REPRODUCIBLE}", "methods": "auto"}


class ModeMethod(LoopMethod):
    """One of our loop's methods (vanilla or a tree), every run in one sampling mode."""

    def __init__(self, method: LoopMethod, mode: str):
        name = BASELINE if method.tree is None and mode == SPECULATIVE else f"{method.name}[{mode}]"
        super().__init__(method.gen, name, method.tree)
        self.mode, self.base = mode, method.name
        self.spec = f"{method.spec}, {mode} sampling"
        if method.tree is not None:
            self.depth = method.depth

    def run(self, input_ids, max_new_tokens, sampling):
        return super().run(input_ids, max_new_tokens, replace(sampling, mode=self.mode))


def parse_floats(text: str, option: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise EagleError(f"{option} takes comma-separated numbers such as 0.7,1.0, got {text!r}") from None
    if not values:
        raise EagleError(f"{option} is empty")
    return values


def parse_modes(text: str) -> list[str]:
    modes = list(dict.fromkeys(m.strip() for m in text.split(",") if m.strip()))
    bad = [m for m in modes if m not in SAMPLING_MODES]
    if bad or not modes:
        raise EagleError(f"--sampling-mode takes {','.join(SAMPLING_MODES)} (one or both), got {text!r}")
    return modes


def mode_methods(gen, names: str, modes: list[str], default_tree: str) -> list[ModeMethod]:
    """vanilla first (the speculative-mode baseline the harness needs), then each method per mode."""
    loop, _ = build_methods(gen, names, [], greedy=False, default_tree=default_tree)
    vanillas = [ModeMethod(loop[0], SPECULATIVE)] + [ModeMethod(loop[0], m) for m in modes if m != SPECULATIVE]
    return vanillas + [ModeMethod(m, mode) for m in loop[1:] for mode in modes]


def run_modes(gen, questions, methods: list[ModeMethod], settings: list[SamplingParams], out: Path, *,
              max_new_tokens: int, meta: dict, dataset: str = "", chat_template: bool = True, warmup: bool = True,
              progress: bool = True) -> dict:
    """Every setting in turn, every method interleaved per question; -> {"rows": [...], "meta": ...}."""
    from .cli import run_journaled

    rows = []
    for sampling in settings:
        where = out / f"t{sampling.temperature:g}-p{sampling.top_p:g}"
        result, summary, _ = run_journaled(gen, questions, methods, where, meta, max_new_tokens=max_new_tokens,
                                           sampling=sampling, dataset=dataset, chat_template=chat_template,
                                           warmup=warmup, progress=progress, plots=False)
        ids = {(e.question_id, e.turn, e.method): e.record.token_ids for e in result.entries}
        prompts = sorted({(q, t) for q, t, _ in ids})
        for m in methods:
            s = summary[m.name]
            vanilla = next(v for v in methods if v.tree is None and v.mode == m.mode)
            base = summary[vanilla.name]
            same = None
            if m.mode == REPRODUCIBLE and m.tree is not None and sampling.seed is not None:
                same = sum(ids[(q, t, m.name)] == ids[(q, t, vanilla.name)] for q, t in prompts)
            steps = s["steps"] or 0
            rows.append({"temperature": sampling.temperature, "top_p": sampling.top_p, "mode": m.mode, "method": m.base,
                         "tokens": s["tokens"], "seconds": s["seconds"], "tokens_per_s": s["tokens_per_s"],
                         "speedup": s["tokens_per_s"] / base["tokens_per_s"] if base["tokens_per_s"] else None,
                         "tau": s["tau"] if m.tree is not None else None,
                         "accepted_per_step": (s["tau"] - 1 if s["tau"] is not None else None) if m.tree is not None else None,
                         "alpha1": (s["n_alpha"] or [None])[0] if m.tree is not None else None,
                         "steps": steps, "identical": same, "prompts": len(prompts)})
    return {"meta": meta, "rows": rows}


def markdown(data: dict) -> str:
    meta = data["meta"]
    lines = [f"# eaglespec bench-modes: {meta.get('dataset')}", "",
             f"- command: `{meta.get('command')}`",
             f"- model: {meta.get('model')}; head: {meta.get('head')}",
             f"- device: {meta.get('device')} ({meta.get('device_name')}); dtype: {meta.get('dtype')}; "
             f"threads: {meta.get('threads')}; date: {meta.get('date')}; max new tokens: {meta.get('max_new_tokens')}; "
             f"seed: {meta.get('seed')}", "",
             "speedup: over vanilla in the same mode; accepted/step: tau - 1 (draft tokens accepted per verification, "
             "stops cut it); 1-alpha: P(first draft token accepted); = vanilla: reproducible EAGLE outputs identical "
             "to seeded vanilla's, of the prompts run.", "",
             "| temperature | top-p | mode | method | tokens/s | speedup | tau | accepted/step | 1-alpha | = vanilla |",
             "|---:|---:|---|---|---:|---:|---:|---:|---:|---|"]

    def f(x, spec=".2f"):
        return "–" if x is None else f"{x:{spec}}"

    for r in data["rows"]:
        same = "–" if r["identical"] is None else f"{r['identical']}/{r['prompts']}"
        lines.append(f"| {r['temperature']:g} | {r['top_p']:g} | {r['mode']} | {r['method']} | {r['tokens_per_s']:.1f} | "
                     f"{f(r['speedup'])}x | {f(r['tau'])} | {f(r['accepted_per_step'])} | {f(r['alpha1'])} | {same} |")
    return "\n".join(lines) + "\n"


def register(subparsers) -> argparse.ArgumentParser:
    from ..cli.options import add_model_args

    p = subparsers.add_parser(
        "bench-modes", help="the speculative and reproducible sampling modes side by side: acceptance, tau, tokens/s",
        description="For each temperature x top-p, run vanilla and each method in both sampling modes on the "
                    "questions, interleaved, and write modes.md and modes.json (and each setting's results.json). "
                    "Exits 1 when a reproducible EAGLE output differs from seeded vanilla's.")
    add_dataset_arg(p)
    p.add_argument("--limit", type=int, default=20, help="the first N questions (default 20)")
    p.add_argument("--methods", default=DEFAULTS["methods"], help="trees as for bench --methods (default auto); vanilla always runs")
    p.add_argument("--sampling-mode", default=DEFAULTS["modes"], help=f"comma-separated (default {DEFAULTS['modes']})")
    p.add_argument("--temperature", default=DEFAULTS["temperature"], help=f"comma-separated (default {DEFAULTS['temperature']})")
    p.add_argument("--top-p", default=DEFAULTS["top_p"], help=f"comma-separated (default {DEFAULTS['top_p']})")
    p.add_argument("--paired", action="store_true", help="pair the i-th temperature with the i-th top-p instead of every combination")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0, help="prompt k samples with seed + k, in every method (default 0)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--no-chat-template", action="store_true")
    p.add_argument("--no-warmup", dest="warmup", action="store_false")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    p.add_argument("--out", type=Path, default=None, help="output directory (default runs/bench-modes-<timestamp>); rerun into it to resume")
    add_model_args(p)
    p.set_defaults(func=cmd_bench_modes, holds_machine=True)
    return p


def sampling_settings(args) -> list[SamplingParams]:
    temps, tops = parse_floats(args.temperature, "--temperature"), parse_floats(args.top_p, "--top-p")
    if args.paired and len(temps) != len(tops):
        raise EagleError(f"--paired needs as many temperatures as top-p values, got {len(temps)} and {len(tops)}")
    pairs = list(zip(temps, tops)) if args.paired else [(t, p) for t in temps for p in tops]
    settings = [SamplingParams(t, p, args.top_k, args.seed) for t, p in pairs]
    if any(s.greedy for s in settings):
        raise EagleError("--temperature must be > 0 here: greedy decoding has no sampling mode (use eaglespec bench)")
    return settings


def cmd_bench_modes(args) -> int:
    from ..cli.options import load_generator
    from .cli import run_metadata
    from .datasets import load_questions

    settings = sampling_settings(args)  # validate before loading
    modes = parse_modes(args.sampling_mode)
    if args.max_new_tokens <= 0:
        raise EagleError(f"--max-new-tokens must be > 0, got {args.max_new_tokens}")
    if REPRODUCIBLE in modes and args.allow_inexact:
        from ..engine.decoding import INEXACT_TREES

        raise EagleError(f"--sampling-mode reproducible cannot hold with --allow-inexact: {INEXACT_TREES}")
    method_names(args.methods, [], args.tree)  # a typo is refused before the target loads
    questions = load_questions(args.dataset, args.limit)
    if args.out is not None:
        output_folder(args.out)  # a file or an unwritable folder is refused before the work
    gen = load_generator(args)
    if gen.target.tokenizer is None:
        raise EagleError(f"target {gen.target.name} has no tokenizer: bench-modes needs one to encode the questions")
    methods = mode_methods(gen, args.methods, modes, args.tree)
    out = args.out or Path("runs") / f"bench-modes-{time.strftime('%Y%m%d-%H%M%S')}"
    meta = run_metadata(gen, methods, command=shlex.join(["eaglespec"] + sys.argv[1:]), head=args.head,
                        dataset=args.dataset, limit=args.limit, max_new_tokens=args.max_new_tokens, seed=args.seed,
                        chat_template=not args.no_chat_template)
    data = run_modes(gen, questions, methods, settings, out, max_new_tokens=args.max_new_tokens, meta=meta,
                     dataset=args.dataset, chat_template=not args.no_chat_template, warmup=args.warmup,
                     progress=args.progress)
    return write_and_verdict(data, out)


def write_and_verdict(data: dict, out: Path) -> int:
    import json

    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / "modes.json", (json.dumps(data, indent=2, default=str) + "\n").encode())
    md = markdown(data)
    atomic_write_bytes(out / "modes.md", md.encode())
    print(md)
    print(f"wrote {out / 'modes.md'}, {out / 'modes.json'}", file=sys.stderr)
    differ = [r for r in data["rows"] if r["identical"] is not None and r["identical"] < r["prompts"]]
    if differ:
        print(f"eaglespec bench-modes: {len(differ)} reproducible method(s) differ from seeded vanilla "
              f"(see {out / 'modes.md'})", file=sys.stderr)
        return 1
    return 0
