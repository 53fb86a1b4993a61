"""`eaglespec` command line: one entry point, one sub-command per job. The jobs' sub-commands
register themselves (`register(subparsers)`); generate, tune and compile live here."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

from ..errors import EagleError
from .options import (DEFAULT_PROMPT, add_compile_arg, add_draft_dtype_arg, add_draft_vocab_args, add_model_args, add_sampling_args, check_counts, check_model_args,
                      load_generator, sampling_mode)


def cmd_generate(args) -> int:
    from ..core.config import SamplingParams
    from ..engine.decoding import GenerationResult
    from ..engine.text import TextStream

    sampling = SamplingParams(args.temperature, args.top_p, args.top_k, args.seed, sampling_mode(args))  # validate before loading
    if args.max_new_tokens <= 0:
        raise EagleError(f"--max-new-tokens must be > 0, got {args.max_new_tokens}")
    if args.compare_vanilla and args.compare_rounds < 1:
        raise EagleError(f"--compare-rounds must be >= 1, got {args.compare_rounds}")
    check_model_args(args)
    gen = load_generator(args)
    ids = gen.encode(args.prompt, chat_template=not args.no_chat_template)
    text = TextStream(gen.decode)
    result = GenerationResult(prompt_tokens=len(ids))
    start = time.perf_counter()
    for step in gen.stream(ids, args.max_new_tokens, sampling):
        result.add(step)
        print(text.push(step.tokens), end="", flush=True)
    result.elapsed = time.perf_counter() - start
    print(text.flush())
    tree = args.tree if gen.tuned is None else f"auto ({gen.tuned.tree.num_nodes - 1} nodes)"
    print(f"\n[eaglespec] tree={tree} new tokens={len(result.token_ids)} target forwards={result.target_forwards} "
          f"tau={result.tau:.2f} tokens/s={result.tokens_per_second:.1f}", file=sys.stderr)
    if args.compare_vanilla:
        _compare_vanilla(gen, ids, args, sampling, result)
    return 0



def _compare_vanilla(gen, ids: list[int], args, sampling, shown) -> None:
    """--compare-vanilla: `--compare-rounds` rounds, each one EAGLE run and one vanilla run back to
    back, the order alternating (EAGLE first in odd rounds), none of them streamed. The speedup is
    the median of the rounds' own ratios (metrics.paired_speedup): a single pair of runs on a
    shared machine also measures how its speed moved between them."""
    from ..bench.metrics import paired_speedup
    from ..core.config import REPRODUCIBLE

    options = dict(input_ids=ids, max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                   top_k=args.top_k, seed=args.seed, sampling_mode=args.sampling_mode)
    rounds, eagle_ids, vanilla = [], set(), None
    for r in range(args.compare_rounds):
        runs = {}
        for speculative in ((True, False) if r % 2 else (False, True)):
            runs[speculative] = gen.generate(speculative=speculative, **options)
        vanilla = runs[False]
        eagle_ids.add(tuple(runs[True].token_ids))
        rounds.append((runs[True].tokens_per_second, vanilla.tokens_per_second))
    paired = paired_speedup(rounds)
    # a sample is expected to differ only in the speculative mode or without a seed
    held = sampling.greedy or (sampling.mode == REPRODUCIBLE and args.seed is not None)
    equal = eagle_ids == {tuple(shown.token_ids)} == {tuple(vanilla.token_ids)}
    same = "identical" if equal else "DIFFERENT" if held else "different (sampling)"
    spread = f", rounds {paired.low:.2f}-{paired.high:.2f}x" if len(rounds) > 1 else ""
    print(f"[vanilla]   new tokens={len(vanilla.token_ids)} target forwards={vanilla.target_forwards} "
          f"tokens/s={paired.vanilla_tokens_per_second:.1f} (EAGLE {paired.tokens_per_second:.1f}) "
          f"speedup={paired.speedup:.2f}x output={same}\n"
          f"            (medians of {len(rounds)} back-to-back rounds of EAGLE and vanilla{spread}; "
          "the streamed run above is not timed against it)", file=sys.stderr)


def cmd_compile(args) -> int:
    """Build now what a first start would build: with --tree auto, the cost curve is measured on
    the compiled path (every tree size it weighs); then `EagleGenerator.warm_batches` builds the
    steps of every batch bucket up to --max-batch's, as `serve` does before it listens."""
    if args.list or args.prune:
        from ..engine import compiled_cache

        folders = compiled_cache.compiled_folders()
        print(compiled_cache.describe(folders))
        if args.prune:
            print(f"removed {sum(f.stale is not None for f in folders)} stale folder(s), "
                  f"{compiled_cache.prune(folders) / 1e9:.1f} GB freed")
        return 0
    if args.max_batch < 1:
        raise EagleError(f"--max-batch must be >= 1, got {args.max_batch}")
    args.compile = "on" if args.compile in (None, "auto") else args.compile
    if args.compile == "off":
        raise EagleError("eaglespec compile --compile off builds nothing: drop --compile off")
    from ..engine.compiled import CompileFailed

    start = time.perf_counter()
    try:
        gen = load_generator(args, max_batch=args.max_batch)  # builds the one-row steps (EagleGenerator.warm)
        gen.warm_batches(args.max_batch, say=lambda line: print(f"[eaglespec] {line}", file=sys.stderr))
    except CompileFailed as exc:  # its own fix: this command exists to compile
        fix = "free some space and run it again" if exc.full else "run it again, or report it"
        raise EagleError(exc.message(f"{fix} (decoding with --compile off needs no compiled steps)")) from None
    stats = gen.target.steps.stats
    print(f"[eaglespec] {stats.graphs} compiled steps ready in {time.perf_counter() - start:.0f} s "
          f"({stats.seconds:.0f} s building or loading them)", file=sys.stderr)
    return 0


CALIBRATION_FROM = 10000  # the shipped head saw the first ~2,000 of the packaged file's 17,671 records


def sharegpt_prompts(count: int, skip_first: int = CALIBRATION_FROM) -> list[str]:
    """First user turns of ShareGPT conversations from record `skip_first` on: by default far past
    the ones the shipped head was trained on; a head trained on a capture with `--eval-first N`
    calibrates on its held-out records instead (`tune --calibration-from 0`)."""
    from ..train.data import SHAREGPT, normalize, read_records

    records, _ = read_records(SHAREGPT)
    if len(records) <= skip_first:
        raise EagleError(f"the packaged ShareGPT file has only {len(records)} records; cannot skip {skip_first}")
    prompts = []
    for i, record in enumerate(records[skip_first:], start=skip_first):
        messages = normalize(record, f"ShareGPT record {i}") or []
        if messages and messages[0]["role"] == "user" and 20 <= len(messages[0]["content"]) <= 400:
            prompts.append(messages[0]["content"])
        if len(prompts) == count:
            break
    return prompts


def cmd_tune(args) -> int:
    """Count the draft vocabulary and the head's acceptance by depth and rank, store both beside
    the head, measure this machine's step costs (stored in the cost cache that `--tree auto`
    reads), then show the tree `--tree auto` would choose."""
    from pathlib import Path

    from ..draft.vocab import FILE as VOCAB_FILE
    from ..draft.vocab import count_tokens, save_draft_vocab
    from ..engine.decoding import EagleGenerator, float32_head_retry
    from ..engine.target import check_device
    from ..engine.tuning import COST_REPS, SIZES, calibrate, tune
    from ..files import cache_dir
    from ..train.config import DataConfig
    from ..train.data import DataSummary, iter_examples

    check_device(args.device)
    check_counts(args, prompts=1, max_new_tokens=1, vocab_examples=1, reps=1, draft_vocab=0, calibration_from=0)
    head_dir = Path(args.head)
    if not head_dir.is_dir():
        raise EagleError(f"head directory {head_dir} does not exist: pass --head DIR")
    from ..engine.compiled import CompileFailed, compile_mode, use_compiled

    mode = compile_mode(args.compile)  # checked now; calibration itself runs eager (acceptance does not depend on kernels)
    gen = EagleGenerator.from_pretrained(args.target, str(head_dir), "eagle1", device=args.device, draft_vocab_size=None,
                                         compile="off")
    ranks_vocab = not gen.head.own_vocabulary  # an EAGLE-3 head has its own (d2t)
    if ranks_vocab and (args.recount or not (head_dir / VOCAB_FILE).is_file()):
        summary = DataSummary()
        examples = iter_examples(gen.target.tokenizer, DataConfig(max_examples=args.vocab_examples), summary)
        counts = count_tokens(((e.input_ids, e.loss_mask) for e in examples), gen.target.vocab_size)
        save_draft_vocab(head_dir, counts)
        top = counts.sort(descending=True).values
        kept = args.draft_vocab or len(top)  # 0: the whole vocabulary, as the other commands read it
        print(f"draft vocabulary: {summary.line()}; the top {kept} tokens cover "
              f"{float(top[:kept].sum() / top.sum()):.1%} of assistant tokens")
    if ranks_vocab:
        gen = EagleGenerator.from_pretrained(args.target, str(head_dir), "eagle1", device=args.device,
                                             draft_vocab_size=args.draft_vocab or None, compile="off",
                                             context_vocab=args.draft_context)
    texts = sharegpt_prompts(args.prompts, args.calibration_from)
    if not texts:
        raise EagleError(f"no usable ShareGPT prompt (a first user turn of 20-400 characters) from record "
                         f"{args.calibration_from} on: pass a smaller --calibration-from")
    stats = calibrate(gen, [gen.encode(p) for p in texts], args.max_new_tokens)
    if stats.steps == 0:  # checked before saving: the head's measured table is not replaced by an empty one
        raise EagleError("no calibration step ran: every calibration prompt ended at once; the head's "
                         "acceptance.json is unchanged")
    print(f"acceptance p[depth][rank] over {stats.steps} steps, saved to {stats.save(head_dir)}")
    for d, row in enumerate(stats.p, start=1):
        print(f"  depth {d}: " + " ".join(f"{x:.2f}" for x in row))
    print(f"[eaglespec] decoding step: {use_compiled(gen.target, mode)}", file=sys.stderr)  # costs measured on it
    choice = getattr(args, "draft_dtype", "auto")
    print(f"[eaglespec] {gen.use_draft_dtype(choice)}", file=sys.stderr)  # as decoding will draft
    reps = COST_REPS if args.reps is None else args.reps

    def measure():  # what later starts with --tree auto read
        return tune(gen, stats, sizes=gen.target.steps.tree_sizes(SIZES), reps=reps, cache=cache_dir(), retune=True)

    retry = None
    try:
        tuned = measure()
    except CompileFailed as exc:  # as from_pretrained
        retry = float32_head_retry(choice, gen.target, exc)
        if retry is None:
            raise
    if retry is not None:  # outside the except block: the failed attempt's frames are let go
        print(f"[eaglespec] {gen.use_draft_dtype('float32', retry)}", file=sys.stderr)
        tuned = measure()
    print(f"step costs on this machine (vanilla step: {tuned.vanilla * 1000:.1f} ms):")
    print("  nodes   tau  draft ms  verify ms  verify/vanilla  speedup (predicted)")
    for n, tau, draft, verify, speedup in tuned.table:
        print(f"  {n:5d} {tau:5.2f} {draft * 1000:9.1f} {verify * 1000:10.1f} {verify / tuned.vanilla:15.2f} {speedup:9.2f}x")
    print(tuned.describe())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eaglespec", description="Lossless EAGLE speculative decoding")
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text with EAGLE and print speed figures")
    g.add_argument("--prompt", default=DEFAULT_PROMPT)
    g.add_argument("--no-chat-template", action="store_true", help="feed the prompt as raw text")
    g.add_argument("--compare-vanilla", action="store_true", help="also run vanilla decoding and print the speedup")
    g.add_argument("--compare-rounds", type=int, default=3,
                   help="with --compare-vanilla: rounds of one EAGLE and one vanilla run back to back (default 3; "
                        "the speedup is the median of the rounds' ratios)")
    add_model_args(g)
    add_sampling_args(g)
    g.set_defaults(func=cmd_generate, holds_machine=True)

    t = sub.add_parser("tune", help="measure a head's acceptance and draft vocabulary; show the auto tree")
    t.add_argument("--head", required=True, help="EAGLE head directory (acceptance.json and draft_vocab.safetensors are written into it)")
    t.add_argument("--target", default=None, help="HF model directory or .gguf file (default: SmolLM2-135M-Instruct)")
    t.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    t.add_argument("--prompts", type=int, default=8, help="ShareGPT prompts (outside the training range) to calibrate on")
    t.add_argument("--calibration-from", type=int, default=CALIBRATION_FROM,
                   help=f"the ShareGPT record the calibration prompts start at (default {CALIBRATION_FROM}, past the shipped "
                        "head's training data; 0 for a head trained with --eval-first, whose first records are held out)")
    t.add_argument("--max-new-tokens", type=int, default=128)
    add_draft_vocab_args(t)  # calibrated as decoding drafts
    t.add_argument("--vocab-examples", type=int, default=4000, help="ShareGPT conversations counted for the draft vocabulary")
    t.add_argument("--reps", type=int, default=None, help="paired timing rounds of the cost curve (the median counts; "
                   "default: the rounds --tree auto measures with, tuning.COST_REPS)")
    t.add_argument("--recount", action="store_true", help="recount the draft vocabulary even if the head has one")
    add_compile_arg(t)
    add_draft_dtype_arg(t)
    t.set_defaults(func=cmd_tune, holds_machine=True)

    c = sub.add_parser("compile", help="build the compiled decoding steps ahead of time (kept on disk for later starts)")
    add_model_args(c)
    c.add_argument("--max-batch", type=int, default=1, help="also build the steps for batches of up to this many "
                   "sequences (as `serve --max-batch`)")
    c.add_argument("--list", action="store_true", help="list the compiled-step folders in the cache (size, "
                   "machine, versions, whether a start can still load them) and build nothing")
    c.add_argument("--prune", action="store_true", help="remove the folders no start can load again (made by "
                   "older versions or artefact schemes) and build nothing")
    c.set_defaults(func=cmd_compile)

    # Each job registers its own sub-command; heavy imports happen inside the handlers.
    from ..bench import batching as bench_batch
    from ..bench import cli as bench_cli
    from ..bench import modes as bench_modes
    from ..interop import cli as interop_cli
    from ..serve import cli as serve_cli
    from ..tools import certify
    from ..train import cli as train_cli
    from . import chat

    train_cli.add_capture_parser(sub)
    train_cli.add_train_parser(sub)
    train_cli.add_distill_parser(sub)
    bench_cli.register(sub)
    bench_batch.register(sub)
    bench_modes.register(sub)
    serve_cli.register(sub)
    chat.register(sub)
    certify.register(sub)
    interop_cli.register(sub)

    return parser


def _set_threads() -> None:
    """EAGLESPEC_NUM_THREADS, where set: torch's intra-op threads."""
    import os

    threads = os.environ.get("EAGLESPEC_NUM_THREADS", "").strip()
    if threads:
        if not threads.isdigit() or int(threads) < 1:
            raise EagleError(f"EAGLESPEC_NUM_THREADS={threads!r}: give a whole number of threads >= 1, or unset it")
        import torch

        torch.set_num_threads(int(threads))


def main(argv: list[str] | None = None) -> int:
    from ..pause import hold_machine

    args = build_parser().parse_args(argv)
    # a timing command holds the machine: captures and training runs sleep until it ends (pause.py)
    holding = hold_machine() if getattr(args, "holds_machine", False) else contextlib.nullcontext()
    try:
        _set_threads()
        with holding:
            return args.func(args)
    except EagleError as exc:
        print(f"eaglespec: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\neaglespec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
