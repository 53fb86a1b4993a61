"""`eaglespec chat`: an interactive terminal chat over the EAGLE generator.

The history is rendered with the target's chat template on every turn; tokens are printed as they
are accepted and each reply ends with a one-line summary (new tokens, tau, tokens/s). `/reset`
clears the history, `/exit` (or end of input) leaves, Ctrl-C stops the current reply only.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TextIO

from ..core.config import SamplingParams
from ..engine.decoding import GenerationResult
from ..engine.text import TextStream
from ..errors import EagleError

HELP = "commands: /reset (forget the conversation), /exit (or Ctrl-D) to leave; Ctrl-C stops a reply"


def chat_loop(gen, sampling: SamplingParams, max_new_tokens: int, inp: TextIO, out: TextIO, info: TextIO | None = None,
              system: str | None = None) -> int:
    """Read user turns from `inp` until /exit or end of input; write replies to `out` and the
    per-reply summaries and notices to `info` (default: `out`)."""
    info = info or out
    interactive = inp.isatty() if hasattr(inp, "isatty") else False
    base = [{"role": "system", "content": system}] if system else []
    history = list(base)
    print(HELP, file=info, flush=True)
    while True:
        if interactive:
            out.write("\n> ")
            out.flush()
        try:
            line = inp.readline()
        except KeyboardInterrupt:
            print("\n(use /exit or Ctrl-D to leave)", file=info, flush=True)
            continue
        if not line:  # end of input
            break
        line = line.strip()
        if not line:
            continue
        if line in ("/exit", "/quit"):
            break
        if line == "/reset":
            history = list(base)
            print("[history cleared]", file=info, flush=True)
            continue
        if line.startswith("/"):
            print(f"unknown command {line.split()[0]}; {HELP}", file=info, flush=True)
            continue
        history.append({"role": "user", "content": line})
        try:
            reply = _reply(gen, history, sampling, max_new_tokens, out, info)
        except EagleError as exc:
            history.pop()
            print(f"error: {exc} (/reset starts a new conversation)", file=info, flush=True)
            continue
        history.append({"role": "assistant", "content": reply})
    return 0


def _reply(gen, history: list[dict], sampling: SamplingParams, max_new_tokens: int, out: TextIO, info: TextIO) -> str:
    ids = gen.encode(messages=history)
    text = TextStream(gen.decode)
    result = GenerationResult(prompt_tokens=len(ids))
    interrupted = False
    start = time.perf_counter()
    steps = gen.stream(ids, max_new_tokens, sampling)
    try:
        for step in steps:
            result.add(step)
            out.write(text.push(step.tokens))
            out.flush()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        steps.close()
    out.write(text.flush() + "\n")
    out.flush()
    result.elapsed = time.perf_counter() - start
    note = " (stopped)" if interrupted else ""
    print(f"[{len(result.token_ids)} new tokens, tau {result.tau:.2f}, {result.tokens_per_second:.1f} tokens/s{note}]",
          file=info, flush=True)
    return text.text


def register(subparsers) -> argparse.ArgumentParser:
    from .options import add_model_args, add_sampling_args

    p = subparsers.add_parser("chat", help="interactive terminal chat with EAGLE decoding",
                              description=f"Multi-turn chat on the target's chat template. {HELP}.")
    add_model_args(p)
    add_sampling_args(p)
    p.add_argument("--system", default=None, help="a system message that starts every conversation")
    p.set_defaults(func=cmd_chat)
    return p


def cmd_chat(args) -> int:
    from .options import load_generator, sampling_mode

    sampling = SamplingParams(args.temperature, args.top_p, args.top_k, args.seed, sampling_mode(args))  # validate before loading
    if args.max_new_tokens <= 0:
        raise EagleError(f"--max-new-tokens must be > 0, got {args.max_new_tokens}")
    gen = load_generator(args)
    if gen.target.tokenizer is None:
        raise EagleError("chat needs a target with a tokenizer")
    return chat_loop(gen, sampling, args.max_new_tokens, sys.stdin, sys.stdout, sys.stderr, system=args.system)
