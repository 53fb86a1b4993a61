"""`eaglespec capture` and `eaglespec train`: argparse sub-commands whose options come from
CaptureConfig / DataConfig / TrainConfig. Handlers raise EagleError for bad input."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import EagleError
from ..files import output_folder
from .config import (CaptureConfig, DataConfig, DistillConfig, TrainConfig, add_config_arguments, config_from_args,
                     parse_layers, to_dict)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=None,
                   help="target model: a Hugging Face model directory, a .gguf file, or 'smollm2' (default: SmolLM2-135M-Instruct)")
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default: cpu)")
    p.add_argument("--overwrite", action="store_true", help="replace what an earlier run wrote into --out")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    p.add_argument("--compute-dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                   help="target and training arithmetic: auto = bfloat16 on CUDA or on a CPU with native bf16 matrix "
                        "units (AVX512-BF16, AMX), float32 otherwise (default: auto)")


def add_capture_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "capture", help="run the target over conversations and store its features for training",
        description="Render conversations with the target's chat template, run the target, and store token ids, "
                    "assistant loss masks and features in sharded safetensors files. Rerunning the same command "
                    "continues an interrupted capture.")
    _add_common(p)
    add_config_arguments(p, CaptureConfig, "capture options")
    p.set_defaults(func=run_capture)
    return p


def add_train_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "train", help="train an EAGLE-1 or EAGLE-3 draft head for a target",
        description="Train an EAGLE-1 head (or an EAGLE-3 head with --head eagle3) on captured features (--capture-dir) or on features computed on the fly "
                    "(--online with --data). Resumes from the checkpoint in --out when there is one. Under torchrun or "
                    "accelerate launch it trains data-parallel (DDP), one GPU per process with --device cuda, with "
                    "the same global batch (--grad-accum), schedule and checkpoints as one process.")
    _add_common(p)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--capture-dir", type=Path, help="a directory written by eaglespec capture")
    source.add_argument("--online", action="store_true", help="compute the target's features during training (no disk)")
    p.add_argument("--partial", action="store_true",
                   help="train on the complete shards of an unfinished capture (an interrupted `eaglespec capture`)")
    p.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help="continue from the checkpoint in --out when one exists (default: on)")
    add_config_arguments(p, DataConfig, "data options (with --online)")
    add_config_arguments(p, TrainConfig, "training recipe")
    p.set_defaults(func=run_train)
    return p


def add_distill_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "distill", help="regenerate the assistant turns of conversations with the target (self-distilled data)",
        description="Keep the system and user turns of each conversation and replace every assistant turn, in order, "
                    "by the target's own reply to the conversation so far. Writes {\"messages\": [...]} records in "
                    "chunk-NNNNN.jsonl files and a manifest; pass the directory as --data to capture or train. "
                    "--max-examples counts the conversations kept; a prompt longer than --max-length ends its "
                    "conversation before that turn (--overflow skip drops the conversation). Rerunning the same "
                    "command continues an interrupted run; another --max-examples extends a run or ends it sooner.")
    _add_common(p)
    add_config_arguments(p, DistillConfig, "distill options")
    p.set_defaults(func=run_distill)
    return p


def _one_process(command: str) -> None:
    from .distributed import launched_processes

    if launched_processes() > 1:
        raise EagleError(f"eaglespec {command} runs as one process (every process would write the same files): start "
                         "it without torchrun / accelerate launch; only eaglespec train is data-parallel")


def run_distill(args) -> int:
    from .distill import describe, distill

    _one_process("distill")
    config = config_from_args(DistillConfig, args)
    output_folder(args.out)  # a file or an unwritable folder is refused before the target loads
    target = _load_target(args)
    manifest = distill(target, config, args.out, overwrite=args.overwrite, progress=args.progress)
    print(f"distilled {describe(manifest)}; {len(manifest['chunks'])} chunk(s) in {args.out}")
    return 0


def _load_target(args):
    from ..engine.target import compute_dtype, load_target

    dtype = compute_dtype(args.compute_dtype, args.device)
    if args.progress:
        print(f"compute dtype: {str(dtype).removeprefix('torch.')} on {args.device}", flush=True)
    return load_target(args.target, dtype=dtype, device=args.device, check=False)


def run_capture(args) -> int:
    from .capture import capture
    from .data import DataSummary

    _one_process("capture")
    config = config_from_args(CaptureConfig, args)
    output_folder(args.out)  # a file or an unwritable folder is refused before the target loads
    target = _load_target(args)
    manifest = capture(target, config, args.out, overwrite=args.overwrite, progress=args.progress)
    summary = manifest.get("summary")
    line = DataSummary.from_record(summary).line() if summary else f"{manifest['examples']} examples"
    print(f"captured {line}; {manifest['tokens']} tokens in {len(manifest['shards'])} shard(s) in {args.out}")
    return 0


def run_train(args) -> int:
    from .distributed import process_group

    config = config_from_args(TrainConfig, args)
    data = config_from_args(DataConfig, args)
    with process_group(args.device) as (dist, device):
        args.device = device  # under torchrun with --device cuda: this process's GPU
        args.progress = args.progress and dist.is_main  # one process prints
        return _train(args, config, data, dist)


def _train(args, config: TrainConfig, data: DataConfig, dist) -> int:
    from .capture import FeatureDataset, OnlineDataset
    from .data import load_examples, source_digest
    from .trainer import eval_line, train

    if args.capture_dir is not None:
        if data != DataConfig():
            raise EagleError("--data, --max-examples, --max-length and --overflow choose the data of --online; "
                             "with --capture-dir the capture fixed them (recapture to change them)")
        dataset = FeatureDataset(args.capture_dir, partial=args.partial, hidden=config.head == "eagle3")
        target = _load_target(args)
        manifest = dataset.manifest
        info = {"source": "capture", "tokens": manifest["tokens"],  # no paths: heads get shipped
                "capture_options": manifest["options"], "capture_summary": manifest["summary"],
                "capture_dtype": manifest.get("compute_dtype"), "data_sha256": manifest.get("data_sha256")}
    else:
        target = _load_target(args)
        examples, summary = load_examples(target.tokenizer, data)
        if dist.is_main:
            print(summary.line(), flush=True)
        layers = parse_layers(config.aux_layers, target.config.num_hidden_layers) if config.head == "eagle3" else None
        dataset = OnlineDataset(target, examples, layers)
        info = {"source": "online", "data_options": to_dict(data), "tokens": summary.tokens,
                "data_sha256": source_digest(data.data)}
    result = train(target, dataset, config, args.out, device=args.device, compute_dtype=target.dtype,
                   overwrite=args.overwrite, resume=args.resume, progress=args.progress, data_info=info, dist=dist)
    if not dist.is_main:
        return 0
    if result.final_eval and not args.progress:  # with progress on, the trainer printed it
        print(eval_line(result.final_eval))
    print(f"wrote head to {result.out_dir} after {result.steps} steps (metrics: {result.out_dir / 'metrics.jsonl'})")
    return 0


def main(argv=None) -> int:
    """Stand-alone entry (python -m eaglespec.train.cli) until the package CLI registers these."""
    parser = argparse.ArgumentParser(prog="eaglespec")
    sub = parser.add_subparsers(dest="command", required=True)
    add_capture_parser(sub)
    add_train_parser(sub)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except EagleError as exc:
        parser.exit(2, f"eaglespec {args.command}: error: {exc}\n")


if __name__ == "__main__":
    raise SystemExit(main())
