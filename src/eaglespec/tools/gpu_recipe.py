"""The GPU head recipe: SmolLM2's EAGLE-3 and EAGLE-1 heads from one CUDA GPU in at most 8 minutes.

A lent GPU machine reaches no package registry and a call carries at most 64 MiB with the
working tree, while the default model's GGUF alone is 98 MB. So the recipe has two halves
(docs/gpu.md has the calls; device_tree.py makes the tree small for them):

    python -m eaglespec.tools.gpu_recipe bundle --out .device        (here, on CPU, once)
        .device/a/  wheels the GPU image lacks (gguf, transformers), and as much of the GGUF as
                    fits beside them and the slim tree in one call
        .device/b/  the rest of the GGUF, pre-rendered ShareGPT examples (examples.npz), their
                    first turns (prompts.npz), MT-bench's question.jsonl, the shipped head cast to
                    bf16 (head/), bundle.json (SHA-256 of the GGUF, data summary, call sizes)
    python -m eaglespec.tools.gpu_recipe run --bundle .device --out $OUT --device cuda   (on the GPU)
        reassembles and verifies the GGUF, trains EAGLE-3 then EAGLE-1 on the examples with the
        target computing features on the fly (no disk), measures tau on MT-bench first turns, and
        writes the two heads (bf16, shards of at most 15 MB) and summary.json into --out.

`--dry-run` runs every stage at toy size (a few examples, two optimizer steps, one question of
8 tokens), so the whole path is tested on CPU before a GPU is ever used.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from ..errors import EagleError
from ..files import atomic_path, atomic_write_bytes, folder_bytes
from .device_tree import CALL_BYTES

PARTS = ("a", "b")
EXAMPLES = "examples.npz"
PROMPTS = "prompts.npz"  # first-turn prompts (chat template applied) for self-distillation on the GPU
BUNDLE = "bundle.json"
QUESTIONS = "question.jsonl"
SHARD_BYTES = 15_000_000  # files come back from a device machine at most 16 MB each
# the GPU image has transformers 5.17 (its models take `past_key_values=`, ours pass `cache=`) and no gguf
WHEELS = ("gguf==0.19.0", "transformers==5.24.0")
JOINED = Path(tempfile.gettempdir()) / "eaglespec-gpu-recipe"  # where the GPU side reassembles the GGUF


# -- examples: token ids and loss masks, compact -------------------------------------------------
def pack_examples(examples, path: Path) -> dict:
    """[Example] -> path (.npz: ids uint16, packed mask bits, offsets). Returns counts."""
    ids = np.concatenate([e.input_ids.numpy() for e in examples])
    if ids.max() >= 1 << 16:
        raise EagleError("the vocabulary exceeds 65,536 tokens: examples.npz stores ids as uint16")
    mask = np.concatenate([e.loss_mask.numpy() for e in examples])
    offsets = np.cumsum([0] + [len(e.input_ids) for e in examples]).astype(np.int64)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez_compressed(f, ids=ids.astype(np.uint16), mask=np.packbits(mask), offsets=offsets)
    return {"examples": len(examples), "tokens": int(offsets[-1])}


def unpack_examples(path: Path, limit: int | None = None):
    from ..train.data import Example

    with np.load(path, allow_pickle=False) as z:
        ids, offsets = z["ids"].astype(np.int64), z["offsets"]
        mask = np.unpackbits(z["mask"])[: len(ids)].astype(bool)
    n = len(offsets) - 1 if limit is None else min(limit, len(offsets) - 1)
    return [Example(torch.from_numpy(ids[offsets[i]:offsets[i + 1]].copy()),
                    torch.from_numpy(mask[offsets[i]:offsets[i + 1]].copy())) for i in range(n)]


def pack_prompts(prompts: list[list[int]], path: Path) -> dict:
    """Token-id prompts -> path (.npz: ids uint16, offsets); they are examples without replies."""
    from ..train.data import Example

    examples = [Example(torch.tensor(p), torch.zeros(len(p), dtype=torch.bool)) for p in prompts]
    counts = pack_examples(examples, path)
    return {"prompts": counts["examples"], "tokens": counts["tokens"]}


def distill_examples(target, prompts: list[torch.Tensor], max_new_tokens: int, batch_size: int,
                     seconds: float | None) -> tuple[list, dict]:
    """Self-distilled examples on the device: the target's greedy reply to each prompt, token for
    token (no chat template needed where it runs): prompt + reply (+ its end-of-sequence id) with
    the reply in the loss mask, as `eaglespec distill` + capture make them (distill.py). Starts no
    batch after the first once `seconds` have passed. -> (examples in prompt order, counts)."""
    from ..train.config import DistillConfig
    from ..train.data import Example
    from ..train.distill import generate, stops

    stop = stops(target)
    config = DistillConfig(max_new_tokens=max_new_tokens, batch_size=batch_size)
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))  # like lengths share a batch
    examples, new_tokens, cut, start = {}, 0, 0, time.perf_counter()
    for b in range(0, len(order), batch_size):
        if b and seconds is not None and time.perf_counter() - start > seconds:
            break
        rows = order[b:b + batch_size]
        for i, (reply, ended) in zip(rows, generate(target, [prompts[i].tolist() for i in rows], config, stop, 0)):
            reply = reply + [stop.eos_token_ids[0]] if ended else reply
            ids = torch.tensor(prompts[i].tolist() + reply)
            mask = torch.zeros(len(ids), dtype=torch.bool)
            mask[len(prompts[i]):] = True
            examples[i] = Example(ids, mask)
            new_tokens += len(reply)
            cut += not ended
    kept = [examples[i] for i in sorted(examples)]
    return kept, {"conversations": len(kept), "new_tokens": new_tokens, "cut_replies": cut,
                  "seconds": time.perf_counter() - start}


# -- the GGUF in two parts -------------------------------------------------------------------------
def split_file(source: Path, out: Path, first: int | None = None) -> dict:
    """source -> out/a/model.part (its first `first` bytes, default half) and out/b/model.part."""
    data = source.read_bytes()
    cut = (len(data) + 1) // 2 if first is None else first
    for part, chunk in zip(PARTS, (data[:cut], data[cut:])):
        (out / part).mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(out / part / "model.part", chunk)
    return {"name": source.name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def join_file(bundle: Path, info: dict, work: Path) -> Path:
    parts = [bundle / p / "model.part" for p in PARTS]
    missing = [str(p) for p in parts if not p.is_file()]
    if missing:
        raise EagleError(f"the model's part(s) {missing} are missing: send .device/a in one call and .device/b in the "
                         "next, on the same warm machine (docs/gpu.md)")
    data = b"".join(p.read_bytes() for p in parts)
    if hashlib.sha256(data).hexdigest() != info["sha256"]:
        raise EagleError(f"the reassembled {info['name']} does not match its SHA-256: rebuild the bundle and resend both parts")
    work.mkdir(parents=True, exist_ok=True)
    path = work / info["name"]
    if not (path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data):
        atomic_write_bytes(path, data)  # an unchanged file keeps its time: its dequantized copy stays valid
    return path


# -- bundle (CPU side) -----------------------------------------------------------------------------
def bundle(out: Path, conversations: int, max_length: int, wheels: bool, prompt_length: int = 384) -> dict:
    from ..bench.datasets import mt_bench_path
    from ..engine.target import default_gguf_path, load_target
    from ..draft.shipped import default_head_dir
    from ..train.config import DataConfig, DistillConfig
    from ..train.data import DataSummary, iter_examples, source_digest
    from ..train.distill import prompt_ids, select

    gguf = default_gguf_path()
    target = load_target(str(gguf), check=False)
    summary = DataSummary()
    config = DataConfig(data="sharegpt", max_examples=conversations, max_length=max_length)
    examples = list(iter_examples(target.tokenizer, config, summary))
    out.mkdir(parents=True, exist_ok=True)
    chats = select(target.tokenizer, DistillConfig(data="sharegpt", max_examples=conversations, max_length=prompt_length,
                                                   overflow="skip", max_turns=1), DataSummary())
    prompts = [prompt_ids(target.tokenizer, m[:-1]) for m in chats]  # max_turns=1: each ends at its first reply
    if wheels:  # first: part a's share of the GGUF is what the wheels leave of a call
        import subprocess

        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.12", "--implementation", "cp", "-d", str(out / "a" / "whl"), *WHEELS],
                       check=True)
    head = default_head_dir(target)
    shutil.rmtree(out / "b" / "head", ignore_errors=True)  # one head: device-call2.sh takes the first
    if head is not None:  # the shipped head, for the check's --head; bf16 is what runs there
        bf16_head_copy(head, out / "b" / "head" / head.name, target.config)
    first, sizes = part_sizes(gguf.stat().st_size, out)
    info = {"gguf": split_file(gguf, out, first), "target": target.identity(), "calls": sizes,
            "data": {**pack_examples(examples, out / "b" / EXAMPLES), "max_length": max_length,
                     "sharegpt_sha256": source_digest("sharegpt"), "summary": summary.to_dict()},
            "prompts": {**pack_prompts(prompts, out / "b" / PROMPTS), "max_length": prompt_length}}
    shutil.copyfile(mt_bench_path(), out / "b" / QUESTIONS)
    atomic_write_bytes(out / "b" / BUNDLE, json.dumps(info, indent=2).encode())
    part_b = folder_bytes(out / "b")
    if sizes["tree"] + part_b > CALL_BYTES:
        raise EagleError(f"part b ({part_b / 2 ** 20:.1f} MiB) and the slim tree ({sizes['tree'] / 2 ** 20:.1f} MiB) "
                         f"exceed the {CALL_BYTES / 2 ** 20:.0f} MiB a device call carries: pass fewer --conversations")
    return info


def part_sizes(model_bytes: int, out: Path, repo: Path | None = None) -> tuple[int, dict]:
    """How many of the GGUF's bytes go in part a: what the slim tree (device_tree.py, plus 1 MiB
    for scripts and stray files) and the wheels leave of one call; the rest goes in part b."""
    from .device_tree import slim_bytes, toplevel

    try:
        tree = slim_bytes(toplevel(repo or Path.cwd())) + 2 ** 20
    except EagleError:  # not a git checkout: the package installed elsewhere
        tree = 4 * 2 ** 20
    wheels = folder_bytes(out / "a" / "whl")
    first = min(CALL_BYTES - tree - wheels, model_bytes)
    if first <= 0:
        raise EagleError(f"the wheels ({wheels / 2 ** 20:.1f} MiB) and the slim tree ({tree / 2 ** 20:.1f} MiB) fill a "
                         "device call alone: make the tree smaller")
    return first, {"tree": tree, "wheels": wheels, "model_first": first, "model_rest": model_bytes - first}


def bf16_head_copy(src: Path, dst: Path, target_config) -> Path:
    """The head in `src` cast to bf16 (half the bytes; the GPU runs it in bf16), written by its own
    save_pretrained, with the files a head loads beside its weights (draft vocabulary, acceptance)."""
    from ..draft.heads import load_head

    extra = json.loads((src / "config.json").read_text()).get("eaglespec", {})
    load_head(src, target_config).to(torch.bfloat16).save_pretrained(dst, extra=extra)
    for name in ("draft_vocab.safetensors", "acceptance.json"):
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)
    return dst


# -- run (GPU side) --------------------------------------------------------------------------------
def _tau(target, head, questions: list[str], max_new_tokens: int, tree: str, seconds: float | None = None) -> dict:
    """tau over `questions` (greedy); starts no question after the first once `seconds` have passed
    (eager decoding on a GPU is launch-bound: ~30 ms a step on the H200), said in "questions"."""
    from ..engine.decoding import EagleGenerator

    gen = EagleGenerator(target, head, tree)
    emitted = steps = tokens = done = 0
    start = time.perf_counter()
    for q in questions:
        if done and seconds is not None and time.perf_counter() - start > seconds:
            break
        result = gen.generate(q, max_new_tokens=max_new_tokens)
        emitted += sum(s.emitted for s in result.steps)
        steps += len(result.steps)
        tokens += len(result.token_ids)
        done += 1
    return {"questions": done, "of": len(questions), "tree": tree, "max_new_tokens": max_new_tokens,
            "tau": emitted / max(steps, 1), "tokens": tokens, "seconds": time.perf_counter() - start}


def run(bundle_dir: Path, out: Path, device: str, minutes: float, dry_run: bool, tau_questions: int,
        data: str = "sharegpt") -> dict:
    from ..bench.datasets import load_jsonl
    from ..draft.heads import load_head
    from ..engine.target import default_dtype, load_target
    from ..train.capture import OnlineDataset
    from ..train.config import TrainConfig, parse_layers
    from ..train.trainer import train

    started = time.perf_counter()
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise EagleError("--device cuda, but torch sees no CUDA GPU here: run on the GPU machine, or pass --device cpu --dry-run")
    info = json.loads((bundle_dir / "b" / BUNDLE).read_text())
    work = out / "work"
    gguf = join_file(bundle_dir, info["gguf"], JOINED)
    target = load_target(str(gguf), dtype=default_dtype(device), device=device, check=True)
    if target.identity()["fingerprint"] != info["target"]["fingerprint"]:
        raise EagleError("the reassembled model is not the one the bundle's examples were rendered for: rebuild the bundle")
    questions = [q.turns[0] for q in load_jsonl(bundle_dir / "b" / QUESTIONS)][: 1 if dry_run else tau_questions]
    summary = {"device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
               "dtype": str(target.dtype), "data": data, "bundle": info["data"], "heads": {}}
    if data == "distill":  # the target's own replies to ShareGPT first turns (docs/training.md, the ablation)
        if "prompts" not in info:
            raise EagleError("this bundle has no prompts for self-distillation: rebuild it, or pass --data sharegpt")
        budget = {"distill": 0.15 * minutes, "eagle3": 0.4 * minutes, "eagle1": 0.15 * minutes}
        prompts = [e.input_ids for e in unpack_examples(bundle_dir / "b" / PROMPTS, limit=6 if dry_run else None)]
        examples, summary["distill"] = distill_examples(target, prompts, 8 if dry_run else 256, 2 if dry_run else 256,
                                                        None if dry_run else 60 * budget["distill"])
        print(f"[gpu-recipe] distilled {len(examples)} replies ({summary['distill']['new_tokens']} tokens) in "
              f"{summary['distill']['seconds']:.0f} s", flush=True)
    else:
        budget = {"eagle3": 0.5 * minutes, "eagle1": 0.2 * minutes}  # the rest: load, evaluation, tau (10% each)
        examples = unpack_examples(bundle_dir / "b" / EXAMPLES, limit=6 if dry_run else None)
    summary["examples_available"] = len(examples)

    def write_summary():
        summary["seconds"] = time.perf_counter() - started
        atomic_write_bytes(out / "summary.json", json.dumps(summary, indent=1, default=str).encode())

    for kind in ("eagle3", "eagle1"):
        t0 = time.perf_counter()
        layers = parse_layers("auto", target.config.num_hidden_layers) if kind == "eagle3" else None
        # a whole step's sequences in one forward (one target forward for their features, too): one
        # ~700-token sequence at a time left the H200 idle (~1 s an EAGLE-3 step in the first lease)
        config = TrainConfig(head=kind, epochs=1, lr=6e-4 if kind == "eagle1" else 1e-3, grad_accum=2 if dry_run else 8,
                             micro_batch=2 if dry_run else 8,
                             warmup=2 if dry_run else 50, schedule="constant", loss_vocab=8192 if kind == "eagle1" else None,
                             eval_fraction=0.34 if dry_run else 0.02, checkpoint_every=10 ** 9,
                             max_steps=2 if dry_run else None, time_limit=None if dry_run else budget[kind])
        result = train(target, OnlineDataset(target, examples, layers), config, work / kind, device=device,
                       progress=False, overwrite=True,
                       data_info={"source": f"gpu-recipe bundle ({data})",
                                  "sharegpt_sha256": info["data"]["sharegpt_sha256"]})
        head = result.head.to(torch.bfloat16)
        extra = json.loads((work / kind / "config.json").read_text()).get("eaglespec", {})
        head.save_pretrained(out / kind, extra=extra, max_shard_bytes=SHARD_BYTES)
        if kind == "eagle1":
            shutil.copyfile(work / kind / "draft_vocab.safetensors", out / kind / "draft_vocab.safetensors")
        trained = time.perf_counter() - t0
        summary["heads"][kind] = {"steps": result.steps, "train_seconds": trained, "final_eval": result.final_eval,
                                  "history": result.history, "mt_bench": None}
        write_summary()  # before tau: a run cut short keeps what it trained
        depth1 = (result.final_eval or {}).get("acc_depth1")
        print(f"[gpu-recipe] {kind}: {result.steps} steps in {trained:.0f} s, held-out top-1 at depth 1 "
              f"{'-' if depth1 is None else f'{depth1:.3f}'}; measuring tau", flush=True)
        loaded = load_head(out / kind, target.config).to(device=target.device, dtype=target.dtype)
        tau = _tau(target, loaded, questions, 8 if dry_run else 256, "eagle1", None if dry_run else 6 * minutes)
        summary["heads"][kind]["mt_bench"] = tau
        write_summary()
        print(f"[gpu-recipe] {kind}: tau {tau['tau']:.2f} on {tau['questions']} MT-bench questions", flush=True)
    shutil.rmtree(work)
    write_summary()
    return summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eaglespec.tools.gpu_recipe", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bundle", help="(CPU) write what the GPU machine cannot fetch into --out, in two parts")
    b.add_argument("--out", type=Path, default=Path(".device"))
    b.add_argument("--conversations", type=int, default=6000, help="ShareGPT conversations to pre-render")
    b.add_argument("--max-length", type=int, default=1024)
    b.add_argument("--no-wheels", dest="wheels", action="store_false", help="do not download the wheels")
    j = sub.add_parser("join", help="(GPU) reassemble and verify the GGUF (for make device-check --target)")
    j.add_argument("--bundle", type=Path, default=Path(".device"))
    r = sub.add_parser("run", help="(GPU) train both heads, measure tau, write them into --out")
    r.add_argument("--bundle", type=Path, default=Path(".device"))
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--device", default="cuda")
    r.add_argument("--minutes", type=float, default=8.0, help="the whole budget; training gets 70%% of it")
    r.add_argument("--tau-questions", type=int, default=20, help="MT-bench first turns for tau (80 on CPU later)")
    r.add_argument("--data", choices=("sharegpt", "distill"), default="sharegpt",
                   help="sharegpt (default): the bundle's ShareGPT conversations as written; distill: the target's own "
                        "greedy replies to their first turns, generated on the device first")
    r.add_argument("--dry-run", action="store_true", help="every stage at toy size (CPU)")
    args = parser.parse_args(argv)
    try:
        if args.command == "bundle":
            info = bundle(args.out, args.conversations, args.max_length, args.wheels)
            print(f"bundle in {args.out}: {info['data']['examples']} examples, {info['data']['tokens']} tokens")
        elif args.command == "join":
            info = json.loads((args.bundle / "b" / BUNDLE).read_text())
            print(join_file(args.bundle, info["gguf"], JOINED))
        else:
            run(args.bundle, args.out, args.device, args.minutes, args.dry_run, args.tau_questions, args.data)
    except EagleError as exc:
        parser.exit(2, f"gpu_recipe: error: {exc}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
