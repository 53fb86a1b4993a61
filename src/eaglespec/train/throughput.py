"""Capture and training throughput on this machine, fp32 against bf16, side by side.

    python -m eaglespec.train.throughput [--target smollm2] [--examples 8] [--max-length 768]

Renders the first ShareGPT conversations, then times, alternating the dtypes round by round:
the target's capture forward (with EAGLE-3's fused layers) and one training micro-step (loss,
backward) of an EAGLE-1 head (8,192-token loss vocabulary) and of an EAGLE-3 head (training-time
test, 7 steps). Prints tokens/s per row and the bf16/fp32 ratio; the machine and its bf16 units
are printed with it, since the figures hold for this machine only.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time

import torch


def _timed(fn, examples) -> float:
    start = time.perf_counter()
    for example in examples:
        fn(example)
    return time.perf_counter() - start


def main(argv=None) -> int:
    from ..target import load_target, native_bf16_cpu
    from .capture import OnlineDataset
    from .config import DataConfig, TrainConfig
    from .data import load_examples
    from .trainer import Trainer

    p = argparse.ArgumentParser(prog="python -m eaglespec.train.throughput", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default=None)
    p.add_argument("--examples", type=int, default=8)
    p.add_argument("--max-length", type=int, default=768)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    targets = {name: load_target(args.target, dtype=dt, check=False) for name, dt in dtypes.items()}
    examples, _ = load_examples(targets["fp32"].tokenizer, DataConfig(max_examples=args.examples, max_length=args.max_length))
    tokens = sum(len(e.input_ids) for e in examples)
    layers = (2, targets["fp32"].config.num_hidden_layers // 2, targets["fp32"].config.num_hidden_layers - 3)
    jobs = {}
    for name, target in targets.items():
        data = OnlineDataset(target, examples, layers)
        jobs[("capture", name)] = (lambda e, t=target: t.capture_states(e.input_ids[None], layers=layers), examples)
        for kind in ("eagle1", "eagle3"):
            config = TrainConfig(head=kind, loss_vocab=8192 if kind == "eagle1" else None, eval_fraction=0.0)
            trainer = Trainer(target, data, config, tempfile.mkdtemp(), progress=False, compute_dtype=dtypes[name])
            samples = [trainer._inputs(i) for i in range(len(examples))]

            def step(inputs, tr=trainer):
                tr._loss(inputs, inputs.features).loss.backward()
                tr.head.zero_grad(set_to_none=True)

            jobs[(f"train {kind}", name)] = (step, samples)
    seconds = dict.fromkeys(jobs, 0.0)
    for _ in range(args.rounds):  # alternate, so that machine drift falls on both dtypes
        for key, (fn, items) in jobs.items():
            seconds[key] += _timed(fn, items)
    print(f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, native bf16: "
          f"{native_bf16_cpu()}; {len(examples)} examples, {tokens} tokens, {args.rounds} rounds")
    print("| job | fp32 tokens/s | bf16 tokens/s | bf16 / fp32 |\n|---|---|---|---|")
    for job in dict.fromkeys(k[0] for k in jobs):
        rate = {name: args.rounds * tokens / seconds[(job, name)] for name in dtypes}
        print(f"| {job} | {rate['fp32']:.0f} | {rate['bf16']:.0f} | {rate['bf16'] / rate['fp32']:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
