"""`eaglespec export` and `eaglespec import` (formats.py does the work)."""

from __future__ import annotations

import argparse
import sys

TARGET_HELP = ("the head's target: HF directory, .gguf file or smollm2. Needed by --format official for EAGLE-1 "
               "heads (the official code loads the target's embed_tokens.weight from the head); llamacpp takes the "
               "target's config and tokenizer from it (default there: SmolLM2); the head's sizes are checked "
               "against it")


def run_export(args) -> int:
    from pathlib import Path

    from ..draft.shipped import head_dir_for
    from .formats import export_head

    head_dir = head_dir_for(args.head_dir) or Path(args.head_dir)
    files = export_head(head_dir, args.out_dir, args.format, target=args.target, overwrite=args.overwrite)
    print(f"[eaglespec] exported {args.head_dir} as {args.format} to {args.out_dir}: "
          + ", ".join(str(f.relative_to(args.out_dir)) for f in files), file=sys.stderr)
    return 0


def run_import(args) -> int:
    from .formats import import_head

    result = import_head(args.dir, args.out_dir, target=args.target, overwrite=args.overwrite)
    print(f"[eaglespec] imported {result.kind.replace('eagle', 'EAGLE-')} head {args.dir} (format: {result.format}) "
          f"to {args.out_dir}: " + ", ".join(str(f.relative_to(args.out_dir)) for f in result.files), file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from .formats import FORMATS

    e = sub.add_parser("export", help="write a head in the layout another engine loads (official EAGLE, vLLM, "
                                      "SGLang, llama.cpp); docs/interop.md")
    e.add_argument("head_dir", help="the head: a folder with config.json and its weights (as `eaglespec train` "
                                    "writes), or a shipped head's name")
    e.add_argument("out_dir", help="a new (or empty) folder; written only when the whole export succeeds")
    e.add_argument("--format", required=True, choices=FORMATS, help="the engine whose loader will read it")
    e.add_argument("--target", default=None, help=TARGET_HELP)
    e.add_argument("--overwrite", action="store_true", help="replace out_dir if it is not empty")
    e.set_defaults(func=run_export)

    i = sub.add_parser("import", help="read a head in any exported layout or an official release into "
                                      "eaglespec's layout (what --head reads directly too)")
    i.add_argument("dir", help="the head folder (official: pytorch_model.bin or safetensors; vLLM; SGLang)")
    i.add_argument("out_dir", help="a new (or empty) folder; written only when the head checks out")
    i.add_argument("--target", default=None, help="also check the head against this target (HF directory, "
                                                  ".gguf file or smollm2)")
    i.add_argument("--overwrite", action="store_true", help="replace out_dir if it is not empty")
    i.set_defaults(func=run_import)
