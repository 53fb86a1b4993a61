"""`eaglespec bench`: the sub-command. `register(subparsers)` adds it to the `eaglespec` parser;
`execute` is the part after the model is loaded, so tests can run it on a tiny model."""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shlex
import sys
import time
from dataclasses import asdict
from datetime import datetime
from pathlib import Path

from ..core.config import SamplingParams
from ..engine.compiled_cache import weights_digest
from ..errors import EagleError
from ..files import output_folder
from .datasets import DATASETS, MT_BENCH, Question, load_questions, user_message
from .methods import (BASELINE, DEFAULT_METHODS, METHODS_HELP, Method, build_methods, check_llamacpp, method_names,
                      parse_depths, warm_methods)

EXIT_NOT_LOSSLESS = 1
# what a resumed run must share with the run it continues, besides its arguments (--limit may grow)
RESUME_META = ("model", "head", "head_weights", "draft_vocab", "draft_dtype", "dtype", "device", "threads", "methods",
               "versions")


def register(subparsers) -> argparse.ArgumentParser:
    from ..cli.options import add_model_args, add_sampling_args

    p = subparsers.add_parser(
        "bench", help="measure speedup, tau and acceptance of EAGLE against vanilla decoding and HF",
        description="Run every method on every question, interleaved question by question, check that greedy "
                    "EAGLE output equals vanilla output, and write results.json, results.md and PNG plots. "
                    f"Exits {EXIT_NOT_LOSSLESS} (after writing the results) when an EAGLE output differs from vanilla.")
    p.add_argument("--dataset", default=MT_BENCH,
                   help=f"{' | '.join(DATASETS)} | a question.jsonl path (question_id, category, turns); default {MT_BENCH}")
    p.add_argument("--limit", type=int, default=None, help="the first N questions only")
    p.add_argument("--turns", type=int, default=1, choices=(1, 2),
                   help="1: first turns only (default); 2: also the second turn, after vanilla's own first answer")
    p.add_argument("--methods", default=DEFAULT_METHODS, help=METHODS_HELP)
    p.add_argument("--chain", default="3,5", help="chain depths for the 'chain' method (default 3,5)")
    p.add_argument("--no-chat-template", action="store_true",
                   help="raw text prompts (HumanEval: the code prompt continued as is)")
    p.add_argument("--out", type=Path, default=None,
                   help="output directory (default runs/bench-<timestamp>); rerunning into it resumes an "
                        "interrupted run of the same settings")
    p.add_argument("--no-warmup", dest="warmup", action="store_false", help="skip the warm-up generation of each method")
    p.add_argument("--no-plots", dest="plots", action="store_false", help="skip the PNG plots")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    add_model_args(p)
    add_sampling_args(p)
    p.set_defaults(func=cmd_bench, holds_machine=True)
    return p


def run_metadata(gen, methods: list[Method], **fields) -> dict:
    import torch
    import transformers

    from .. import __version__

    device = gen.target.device
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or platform.machine())
    return {
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "model": gen.target.name,
        "dtype": str(gen.target.dtype).removeprefix("torch."),
        "device": str(device),
        "device_name": device_name,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "methods": {m.name: m.spec for m in methods},
        "head_weights": None if gen.head is None else weights_digest(gen.given_head),  # as loaded, whatever it drafts in
        "draft_dtype": None if gen.head is None else str(gen.draft_dtype).removeprefix("torch."),
        "draft_vocab": draft_vocab_rows(gen),
        "versions": {"eaglespec": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
        "platform": platform.platform(),
        **fields,
    }


def draft_vocab_rows(gen) -> int | str | None:
    """What the draft scores: the reduced vocabulary's size, "full", "the head's own" (EAGLE-3), or
    None without a head."""
    if gen.head is None:
        return None
    if gen.head.own_vocabulary:
        return "the head's own"
    return "full" if gen.draft_vocab is None else int(gen.draft_vocab.numel())


def execute(gen, questions: list[Question], methods: list[Method], out: Path, meta: dict, *, max_new_tokens: int,
            sampling: SamplingParams, turns: int = 1, dataset: str = "", chat_template: bool = True,
            warmup: bool = True, progress: bool = True, plots: bool = True) -> int:
    """Run, write every output, print the table; -> exit code (EXIT_NOT_LOSSLESS on an EAGLE mismatch)."""
    from .report import markdown

    result, summary, meta = run_journaled(gen, questions, methods, out, meta, max_new_tokens=max_new_tokens,
                                          sampling=sampling, turns=turns, dataset=dataset, chat_template=chat_template,
                                          warmup=warmup, progress=progress, plots=plots)
    print(markdown(result, summary, meta))
    if result.failures:
        print(f"eaglespec bench: LOSSLESSNESS FAILURE: {len(result.failures)} EAGLE output(s) differ from vanilla "
              f"under greedy decoding or seeded reproducible sampling (see {out / 'results.md'})", file=sys.stderr)
        return EXIT_NOT_LOSSLESS
    return 0


def run_journaled(gen, questions: list[Question], methods: list[Method], out: Path, meta: dict, *, max_new_tokens: int,
                  sampling: SamplingParams, turns: int = 1, dataset: str = "", chat_template: bool = True,
                  warmup: bool = True, progress: bool = True, plots: bool = True):
    """Run (resuming the journal in `out`) and write results.json / results.md / plots there;
    -> (BenchResult, summary, meta with the prompt count)."""
    from .harness import Journal, run_bench
    from .metrics import summarize
    from .report import write_outputs

    journal = Journal(out, {**{k: meta.get(k) for k in RESUME_META}, "dataset": dataset, "turns": turns,
                            "chat_template": chat_template, "max_new_tokens": max_new_tokens,
                            "sampling": asdict(sampling)})
    if journal.done:
        print(f"resuming: {len(journal.done)} prompt(s) already done in {journal.path}", file=sys.stderr)
    result = run_bench(
        questions, methods,
        encode=lambda messages: gen.encode(messages=messages, chat_template=chat_template),
        decode=lambda ids: gen.decode(ids) or "",
        max_new_tokens=max_new_tokens, sampling=sampling, turns=turns, warmup=warmup, progress=progress,
        user_text=lambda q, t: user_message(q, t, dataset, chat_template), journal=journal)
    meta = {**meta, "prompts": len({(e.question_id, e.turn) for e in result.entries})}
    summary = summarize([(e.method, e.category, e.record) for e in result.entries], BASELINE,
                        {m.name: m.depth for m in methods})
    paths = write_outputs(out, result, summary, meta, plots)
    print("wrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return result, summary, meta


def prompt_contexts(gen, questions: list[Question], turns: int, dataset: str, chat_template: bool,
                    max_new_tokens: int) -> tuple[int, ...]:
    """The longest sequence (prompt + new tokens) each prompt of the run can make: a first turn's
    own length, a second turn's bounded by both user turns and a first answer of max_new_tokens."""
    if not gen.target.steps.builds_steps:
        return ()
    out = []
    for q in questions:
        messages = []
        for t in range(min(turns, len(q.turns))):
            messages.append({"role": "user", "content": user_message(q, t, dataset, chat_template)})
            out.append(len(gen.encode(messages=messages, chat_template=chat_template)) + (t + 1) * max_new_tokens)
            messages.append({"role": "assistant", "content": ""})
    return tuple(out)


def cmd_bench(args) -> int:
    from ..cli.options import load_generator, sampling_mode

    sampling = SamplingParams(args.temperature, args.top_p, args.top_k, args.seed, sampling_mode(args))  # validate before loading
    if args.max_new_tokens <= 0:
        raise EagleError(f"--max-new-tokens must be > 0, got {args.max_new_tokens}")
    if args.out is not None:
        output_folder(args.out)  # a file or an unwritable folder is refused before the work
    chains = parse_depths(args.chain)
    method_names(args.methods, chains, args.tree)  # a typo is refused before the target loads
    questions = load_questions(args.dataset, args.limit)
    gguf = check_llamacpp(args.methods, args.target, sampling.greedy)  # before minutes of loading and compiling
    gen = load_generator(args)
    if gen.target.tokenizer is None:
        raise EagleError(f"target {gen.target.name} has no tokenizer: bench needs one to encode the questions")
    with contextlib.ExitStack() as servers:  # the llama.cpp methods' servers, stopped at the end
        methods, notes = build_methods(gen, args.methods, chains, sampling.greedy, default_tree=args.tree,
                                       servers=servers, gguf=gguf)
        return _bench(args, gen, questions, methods, notes, sampling)


def _bench(args, gen, questions: list[Question], methods: list[Method], notes: list[str], sampling: SamplingParams) -> int:
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    # the compiled path builds a set of graphs per cache size: build them all now, not inside a timing
    contexts = prompt_contexts(gen, questions, args.turns, args.dataset, not args.no_chat_template, args.max_new_tokens)
    warm_methods(gen, methods, contexts)
    out = args.out or Path("runs") / f"bench-{time.strftime('%Y%m%d-%H%M%S')}"
    head = args.head + (f" ({gen.head_note})" if gen.head_note else "")
    meta = run_metadata(
        gen, methods, command=shlex.join(["eaglespec"] + sys.argv[1:]), head=head, dataset=args.dataset,
        limit=args.limit, turns=args.turns, chat_template=not args.no_chat_template,
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
        seed=args.seed, warmup=args.warmup)
    return execute(gen, questions, methods, out, meta, max_new_tokens=args.max_new_tokens, sampling=sampling,
                   turns=args.turns, dataset=args.dataset, chat_template=not args.no_chat_template,
                   warmup=args.warmup, progress=args.progress, plots=args.plots)
