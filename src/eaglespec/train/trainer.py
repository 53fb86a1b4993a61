"""Training loop for an EAGLE-1 or EAGLE-3 head (`eaglespec train`).

`micro_batch` sequences per forward (right-padded; one by default), `grad_accum` sequences per
AdamW step. The loss of a step is the mean over its sequences of each one's loss, whatever the
micro-batch size: a larger one changes only the arithmetic's grouping (what a GPU needs to be
busy), not the step. The data order is a function
of (seed, epoch) alone, and a checkpoint holds everything else that a step depends on (head,
optimizer, scheduler, RNG states, the position in the epoch's order), so a resumed run on CPU is
bit-for-bit the uninterrupted one (under the same micro-batch size; under another, equal up to
float rounding). The target's embedding and LM head are used, frozen, and
never handed to the optimizer.

Data-parallel (`torchrun`, see distributed.py): `grad_accum` stays the global batch. Each step's
sequences are dealt to the processes (process r takes every world_size-th, from r), DDP sums
their gradients, and every process takes the same AdamW step; the feature noise of a sequence is
seeded by (seed, epoch, example). The data order, the schedule and the checkpoints are those of
one process, so a checkpoint resumes under any number of processes, and the weights equal a
one-process run's up to the order of the gradient sums. Rank 0 alone writes files.

Files in the output directory:
    config.json, model.safetensors   the head (EagleHead.save_pretrained), with a training summary
    metrics.jsonl                    one JSON object per line: kind "train" (every log_every steps)
                                     or "eval" (after every epoch and at the end)
    loss_curve.png                   training and held-out losses, held-out accuracies
    draft_vocab.safetensors          EAGLE-1: target token ids ranked by their count in the training
                                     split's assistant tokens (the reduced draft vocabulary,
                                     draft/vocab.py); an EAGLE-3 head holds its own (d2t / t2d)
    checkpoint.pt                    while training runs; removed when it finishes
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from ..core.verify import greedy_ids
from ..draft import vocab
from ..draft.contract import CONFIG, WEIGHTS, read_extra
from ..draft.eagle3 import Eagle3Config, Eagle3Head
from ..draft.head import EagleHead, grow_head
from ..draft.heads import load_head
from ..draft.shipped import head_dir_for, shipped_names
from ..errors import EagleError
from ..files import atomic_path, atomic_write_bytes
from ..pause import PAUSE_FILE, idle, wait_if_paused
from .capture import check_identity
from .config import TrainConfig, from_dict, parse_layers, to_dict
from .distributed import Distributed
from .loss import HeadInputs, LossParts, collate, eagle_loss, head_inputs, rollout_correct, ttt_loss

CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"
PLOT = "loss_curve.png"
_OUTPUTS = (CONFIG, WEIGHTS, METRICS, PLOT, CHECKPOINT, vocab.FILE)
DATA_KEYS_ADDED = ("read", "capture_dtype", "data_sha256")  # recorded since 2026-12-06


@dataclass
class TrainResult:
    head: EagleHead | Eagle3Head
    out_dir: Path
    steps: int
    history: list[dict]  # the rows of metrics.jsonl

    @property
    def final_eval(self) -> dict | None:
        return last_eval(self.history)


def last_eval(history: list[dict]) -> dict | None:
    return next((row for row in reversed(history) if row["kind"] == "eval"), None)


def split(n: int, fraction: float, seed: int, first: int | None = None) -> tuple[list[int], list[int]]:
    """Deterministic held-out split -> (train indices, eval indices); at least one of each when n > 1.
    `first`: the first `first` examples are held out, whatever n (a growing capture keeps them)."""
    if first is not None:
        if first >= n:
            raise EagleError(f"--eval-first {first} holds out all {n} examples: pass a smaller count or more data")
        return list(range(first, n)), list(range(first))
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    n_eval = min(n - 1, math.ceil(n * fraction)) if fraction > 0 else 0
    return sorted(order[n_eval:]), sorted(order[:n_eval])


def epoch_order(train: list[int], seed: int, epoch: int) -> list[int]:
    g = torch.Generator().manual_seed(seed * 100_003 + epoch + 1)
    return [train[i] for i in torch.randperm(len(train), generator=g).tolist()]


def noise_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of example `index`'s feature noise in `epoch`: whichever process reads it."""
    return ((seed * 1_000_003 + epoch) * 1_000_003 + index + 1) % 2 ** 63


def lr_factor(step: int, warmup: int, total: int, schedule: str) -> float:
    """Linear warm-up over `warmup` steps, then constant or linear decay to 0 at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    return max(0.0, (total - step) / max(1, total - warmup))


def prepare_out_dir(out_dir: Path, overwrite: bool, resume: bool) -> bool:
    """-> whether to resume from the checkpoint there. Refuses a non-empty directory unless it
    holds a checkpoint to resume or --overwrite is given (which removes only what training writes)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise EagleError(f"--out {out_dir} is a file: pass a directory for the head")
    out_dir.mkdir(parents=True, exist_ok=True)
    if overwrite:
        for name in _OUTPUTS:
            (out_dir / name).unlink(missing_ok=True)
        return False
    for leftover in out_dir.glob(".*.tmp"):  # an atomic write cut short (a kill -9): never a complete file
        leftover.unlink(missing_ok=True)
    if resume and (out_dir / CHECKPOINT).is_file():
        return True
    if any(p.name != PAUSE_FILE for p in out_dir.iterdir()):
        raise EagleError(f"--out {out_dir} is not empty and holds no checkpoint to resume: pass --overwrite or a new directory")
    return False


class _StepLoss(torch.nn.Module):
    """A micro-batch's training loss as the forward of a module that owns the head: what DDP
    wraps, since its gradient hooks need the loss made inside its forward (EAGLE-3's loss calls
    several of the head's methods, not its forward)."""

    def __init__(self, head: torch.nn.Module, loss):
        super().__init__()
        self.head = head
        self.loss = loss  # Trainer._loss; it reads the target's frozen LM head, which DDP must not see

    def forward(self, inputs: HeadInputs | None, features: torch.Tensor | None) -> LossParts:
        # Every parameter joins the graph with weight 0: DDP then finds a gradient for each one even
        # when a sequence leaves part of the head unused, or when this process has no sequence left
        # in a step (inputs None), and still joins the all-reduce, with zeros.
        touch = sum(p.reshape(-1)[0] for p in self.head.parameters() if p.requires_grad) * 0.0
        if inputs is None:
            zero = touch.detach()
            return LossParts(touch, zero, zero, 0, 0)
        parts = self.loss(inputs, features)
        return dataclasses.replace(parts, loss=parts.loss + touch)


class Trainer:
    def __init__(self, target, dataset, config: TrainConfig, out_dir: str | os.PathLike, device: str = "cpu",
                 overwrite: bool = False, resume: bool = True, progress: bool = True, data_info: dict | None = None,
                 compute_dtype: torch.dtype | None = None, dist: Distributed | None = None):
        """compute_dtype: the autocast dtype of the head's arithmetic (master weights stay fp32);
        default bf16 on CUDA, fp32 on CPU (`target.fast_dtype` picks bf16 where a CPU has it natively);
        float64 trains the head in float64 (tests that compare runs). dist: this process among
        data-parallel ones (default: the initialised process group, if any; see distributed.py)."""
        check_identity(dataset.identity, target, "the training data")
        if len(dataset) < 2 and config.eval_fraction > 0 and config.eval_first is None:
            raise EagleError(f"{len(dataset)} example(s) cannot be split into training and held-out sets: "
                             "capture more data or pass --eval-fraction 0")
        self.target, self.dataset, self.config = target, dataset, config
        self.out_dir = Path(out_dir).expanduser()
        self.device = torch.device(device)
        self.compute_dtype = compute_dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self.param_dtype = torch.float64 if self.compute_dtype == torch.float64 else torch.float32
        self.dist = dist or Distributed.current()
        self.progress = progress and self.dist.is_main
        self.data_info = {"examples": len(dataset), **(data_info or {})}
        target.model.requires_grad_(False)
        self.train_idx, self.eval_idx = split(len(dataset), config.eval_fraction, config.seed, config.eval_first)
        if config.train_examples is not None:
            if config.train_examples > len(self.train_idx):
                raise EagleError(f"--train-examples {config.train_examples} is more than the {len(self.train_idx)} "
                                 "examples of the training split: pass a smaller count or leave it unset")
            self.train_idx = self.train_idx[:config.train_examples]
        if not self.train_idx:
            raise EagleError("no training examples left after the held-out split: lower --eval-fraction")
        # what this run reads: with --eval-first and --train-examples, the first examples of a capture,
        # the same however far the capture has grown since (a scaling point resumes on a growing one)
        read = self.eval_idx + self.train_idx
        self.data_info["read"] = {"examples": len(read), "tokens": sum(int(dataset.tokens(i)[0].numel()) for i in read)}
        self.steps_per_epoch = math.ceil(len(self.train_idx) / config.grad_accum)
        self.total_steps = config.epochs * self.steps_per_epoch
        if config.max_steps is not None:
            self.total_steps = min(self.total_steps, config.max_steps)
        self._resume = self.dist.on_main(lambda: prepare_out_dir(self.out_dir, overwrite, resume))

        self.counts = vocab.count_tokens((dataset.tokens(i) for i in self.train_idx), target.vocab_size)
        ranked = torch.sort(self.counts, descending=True, stable=True).indices
        torch.manual_seed(config.seed)
        if config.head == "eagle1":
            self.head = EagleHead(target.config, fc_bias=config.fc_bias, layers=config.head_layers).to(self.device, self.param_dtype)
            self.lm_head = self._sliced_lm_head(None if config.loss_vocab is None else ranked[:config.loss_vocab])
        else:
            layers = parse_layers(config.aux_layers, target.config.num_hidden_layers)
            if not getattr(dataset, "read_hidden", True):
                raise EagleError("an EAGLE-3 head trains on the capture's fused layers: open it with "
                                 "FeatureDataset(directory, hidden=True) (the default)")
            if getattr(dataset, "layers", None) != layers:
                raise EagleError(f"an EAGLE-3 head on layers {list(layers)} needs those target layers in its data, which holds "
                                 f"{list(dataset.layers) if getattr(dataset, 'layers', None) else 'none'}: capture with "
                                 f"--aux-layers {','.join(map(str, layers))} (or train with the layers the capture has)")
            size = min(config.draft_vocab_size, target.vocab_size)
            self.head = Eagle3Head(Eagle3Config.for_target(target.config, size, layers))
            self.head.set_draft_vocab(ranked[:size])
            self._init_from_target()
            self.head.to(self.device, self.param_dtype)
            self.lm_head = self._sliced_lm_head(self.head.target_ids())
        if config.init_from is not None:
            self._init_from_head(config.init_from)
        self.optimizer = torch.optim.AdamW(self.head.parameters(), lr=config.lr, betas=(config.beta1, config.beta2),
                                           weight_decay=config.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, config.warmup, self.total_steps, config.schedule))
        self.noise_rng = torch.Generator(device=self.device).manual_seed(config.seed + 1)  # reseeded per sequence
        self.model: torch.nn.Module = _StepLoss(self.head, self._loss)  # DDP-wrapped in run() when data-parallel
        self.step, self.epoch, self.position, self.history = 0, 0, 0, []
        self.window: list[list[float]] = []  # per-step [loss, feature, token] since the last train row

    @torch.no_grad()
    def _init_from_target(self) -> None:
        """Start an EAGLE-3 head's output layer where the target's is: its LM head rows for the
        draft vocabulary and its final norm. The head then trains from a working read-out, which
        matters when data is short (a CPU run); training moves them freely afterwards."""
        lm = self.target.lm_head.weight
        self.head.lm_head.weight.copy_(lm[self.head.target_ids().to(lm.device)].to(self.head.lm_head.weight))
        norm = getattr(self.target.decoder, "norm", None)
        if norm is not None and getattr(norm, "weight", None) is not None and norm.weight.shape == self.head.norm.weight.shape:
            self.head.norm.weight.copy_(norm.weight.to(self.head.norm.weight))

    @torch.no_grad()
    def _init_from_head(self, source: str) -> None:
        """--init-from: the head starts from another head's weights (continued training). It must
        be the head this run builds, tensor for tensor; an EAGLE-3 head keeps its own draft
        vocabulary (its token loss is then scored over that vocabulary)."""
        directory = head_dir_for(source)
        if directory is None or not (directory / "config.json").is_file():
            raise EagleError(f"--init-from {source}: no head folder there, nor a shipped head of that name "
                             f"({', '.join(shipped_names()) or 'none shipped'}); give a folder written by eaglespec train")
        loaded = load_head(directory, self.target.config)
        recorded = read_extra(directory).get("target", {}).get("fingerprint")
        if recorded is not None and recorded != self.target.fingerprint():
            raise EagleError(f"--init-from {source}: it was trained for another target (fingerprint {recorded}, this one "
                             f"{self.target.fingerprint()}); continue a head of this target's")
        if loaded.kind != self.config.head:
            raise EagleError(f"--init-from {source}: an {loaded.kind} head, and this run trains --head {self.config.head}; "
                             f"pass --head {loaded.kind} or another head")
        if loaded.hidden_layers != self.head.hidden_layers:
            raise EagleError(f"--init-from {source}: it fuses target layers {list(loaded.hidden_layers)}, this run "
                             f"{list(self.head.hidden_layers)}: train with --aux-layers {','.join(map(str, loaded.hidden_layers))} "
                             "(a capture holding those layers)")
        grow = self.config.head == "eagle1" and loaded.layers < self.head.layers
        ours, theirs = self.head.state_dict(), loaded.state_dict()
        differ = sorted(k for k in set(ours) | set(theirs) if k not in ours or k not in theirs or ours[k].shape != theirs[k].shape)
        if grow:  # the layers it lacks are ours alone
            new = tuple(f"decoder.layers.{i}." for i in range(loaded.layers, self.head.layers))
            differ = [k for k in differ if k in theirs or not k.startswith(new)]
        if differ:
            raise EagleError(f"--init-from {source}: its tensors differ from the head this run builds ({', '.join(differ[:4])}"
                             f"{' ...' if len(differ) > 4 else ''}): train with the options it was trained with "
                             "(--fc-bias, --head-layers, --draft-vocab-size, --aux-layers)")
        self.head.load_state_dict({k: v.to(ours[k].device, ours[k].dtype) for k, v in theirs.items()}, strict=not grow)
        if grow:
            grow_head(self.head, loaded, source)
        if self.config.head == "eagle3":  # its vocabulary came with it
            self.lm_head = self._sliced_lm_head(self.head.target_ids())

    def _sliced_lm_head(self, keep: torch.Tensor | None) -> torch.nn.Module:
        """The target's LM head, or its rows for the target ids `keep` (a draft vocabulary): p (and
        for EAGLE-1 q) are then renormalised over that vocabulary, as the drafter uses it."""
        full = self.target.lm_head
        if keep is None or keep.numel() >= self.target.vocab_size:
            return full
        keep = keep.to(full.weight.device)
        sliced = torch.nn.Linear(full.in_features, keep.numel(), bias=full.bias is not None).to(full.weight.device, full.weight.dtype)
        with torch.no_grad():
            sliced.weight.copy_(full.weight[keep])
            if full.bias is not None:
                sliced.bias.copy_(full.bias[keep])
        return sliced.requires_grad_(False)

    def autocast(self):
        """bf16 autocast (fp32 master weights) when the compute dtype is bf16; plain fp32 otherwise."""
        if self.compute_dtype == torch.bfloat16:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # -- one sequence, or a micro-batch of them ---------------------------------------------
    def _inputs(self, index: int) -> HeadInputs:
        return self._head_inputs(self.dataset[index])

    def _head_inputs(self, s) -> HeadInputs:
        hidden = s.hidden if self.head.hidden_layers is not None else None
        return head_inputs(s.input_ids, s.loss_mask, s.features, self.target.embed_tokens, self.param_dtype,
                           self.device, hidden=hidden)

    def _micro_batch(self, indices: list[int]) -> HeadInputs:
        """The training inputs of `indices`, each with its own seeded feature noise, right-padded
        into one micro-batch. A dataset with `samples(indices)` (OnlineDataset: one target forward
        for the lot) reads them together."""
        many = getattr(self.dataset, "samples", None)
        samples = many(indices) if many is not None and len(indices) > 1 else [self.dataset[i] for i in indices]
        batch = []
        for index, sample in zip(indices, samples):
            inputs = self._head_inputs(sample)
            self.noise_rng.manual_seed(noise_seed(self.config.seed, self.epoch, index))
            batch.append(dataclasses.replace(inputs, features=self._noisy(inputs.features)))
        return collate(batch)

    def _loss(self, inputs: HeadInputs, features: torch.Tensor) -> LossParts:
        c = self.config
        with self.autocast():
            if not self.head.predicts_features:
                parts = ttt_loss(self.head, HeadInputs(inputs.embeds, features, inputs.target, inputs.mask),
                                 self.lm_head, c.ttt_steps, c.ttt_decay)
                zero = parts.token_loss.new_zeros(())
                return LossParts(parts.loss, zero, parts.token_loss, parts.correct[0] if parts.correct else 0,
                                 parts.positions[0] if parts.positions else 0)
            predicted = self.head(inputs.embeds, features)
            return eagle_loss(predicted, inputs.target, inputs.mask, self.lm_head,
                              c.feature_loss_weight, c.token_loss_weight)

    def _depth_hits(self, inputs: HeadInputs, positions: int) -> list[tuple[int, int]]:
        """(top-1 hits, positions) at draft depths 1..eval_depths (EAGLE-3: 1..max(eval_depths,
        ttt_steps), teacher-forced tokens and the head's own states, against the target's top-1
        over its full vocabulary)."""
        c = self.config
        with self.autocast():
            if self.head.predicts_features:
                return [(h, positions) for h in rollout_correct(self.head, inputs, self.lm_head, c.eval_depths)]
            wanted = greedy_ids(self.target.lm_head(inputs.target.to(self.target.dtype)))
            parts = ttt_loss(self.head, inputs, self.lm_head, max(c.eval_depths, c.ttt_steps), c.ttt_decay, wanted)
            return list(zip(parts.correct, parts.positions))

    def _noisy(self, features: torch.Tensor) -> torch.Tensor:
        noise = self.config.feature_noise
        if noise == 0:
            return features
        u = torch.rand(features.shape, generator=self.noise_rng, device=features.device, dtype=features.dtype)
        return features + (2 * u - 1) * noise

    # -- checkpoints --------------------------------------------------------------------------
    def _state(self) -> dict:
        return {
            "head": self.head.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(), "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "step": self.step, "epoch": self.epoch, "position": self.position, "history": self.history,
            "window": self.window,
            "config": to_dict(self.config), "target": self.target.identity(), "data": self.data_info,
            "run": self._run_record(),
        }

    def _run_record(self) -> dict:
        """The arithmetic a run's steps use: a resumed run must use the same."""
        return {"compute_dtype": str(self.compute_dtype).removeprefix("torch."), "device": self.device.type}

    def save_checkpoint(self) -> None:
        if not self.dist.is_main:  # every process holds the same state
            return
        with atomic_path(self.out_dir / CHECKPOINT) as tmp:
            torch.save(self._state(), tmp)
        self._write_metrics()

    def load_checkpoint(self) -> None:
        """Every process reads the same file (--out is shared, as the data is), and so passes or
        fails the same checks."""
        path = self.out_dir / CHECKPOINT
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)  # never unpickle
        except Exception as exc:  # a truncated or foreign file
            raise EagleError(f"{path} is not a readable checkpoint ({exc}); pass --overwrite to start again") from exc
        check_identity(state["target"], self.target, f"checkpoint {path}")
        theirs = from_dict(TrainConfig, state["config"], str(path))
        # a time limit may change, and so may the micro-batch (the same steps, grouped otherwise)
        if dataclasses.replace(theirs, time_limit=self.config.time_limit, micro_batch=self.config.micro_batch) != self.config:
            free = ("time_limit", "micro_batch")
            diff = sorted(k for k, v in to_dict(theirs).items() if k not in free and getattr(self.config, k) != v)
            raise EagleError(f"checkpoint {path} was made with other training options ({', '.join(diff)}): "
                             "rerun with the same options to resume, or pass --overwrite (or --no-resume) to start again")
        if not self._same_data(state["data"]):
            raise EagleError(f"checkpoint {path} was made on other data ({state['data']} vs {self.data_info}): "
                             "resume on the same data, or pass --overwrite to start again")
        run = self._run_record()
        if "run" in state and state["run"] != run:  # checkpoints before 2026-12-06 did not record it
            theirs = state["run"]
            raise EagleError(f"checkpoint {path} was made with compute dtype {theirs['compute_dtype']} on "
                             f"{theirs['device']}, this run has {run['compute_dtype']} on {run['device']}: resume with "
                             f"--compute-dtype {theirs['compute_dtype']} --device {theirs['device']}, or pass --overwrite")
        self.head.load_state_dict(state["head"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])
        if state["cuda_rng"] is not None and torch.cuda.is_available():  # a machine may have fewer GPUs
            for i, rng in enumerate(state["cuda_rng"][:torch.cuda.device_count()]):
                torch.cuda.set_rng_state(rng, i)
        self.step, self.epoch, self.position = state["step"], state["epoch"], state["position"]
        self.history, self.window = state["history"], state["window"]

    def _same_data(self, theirs: dict) -> bool:
        """Whether a checkpoint's data record is this run's. With --eval-first and --train-examples
        the run reads the capture's first examples only, so the capture's size (examples, tokens,
        a summary that appears when it completes) may differ: what was read must not. Keys recorded
        since a checkpoint was made (DATA_KEYS_ADDED) are not held against it."""
        theirs, ours = dict(theirs), dict(self.data_info)
        for key in DATA_KEYS_ADDED:
            if key not in theirs:
                ours.pop(key, None)
        if self.config.eval_first is not None and self.config.train_examples is not None:
            for key in ("examples", "tokens", "capture_summary"):
                theirs.pop(key, None)
                ours.pop(key, None)
        return theirs == ours

    # -- evaluation ---------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> dict:
        """Held-out losses and accuracies; data-parallel, each process scores its share."""
        self.head.eval()
        c = self.config
        feature, token, positions = 0.0, 0.0, 0
        depths = c.eval_depths if self.head.predicts_features else max(c.eval_depths, c.ttt_steps)
        hits, counted = [0] * depths, [0] * depths
        for index in self.dist.shard(self.eval_idx):
            inputs = self._inputs(index)
            parts = self._loss(inputs, inputs.features)
            for k, (h, m) in enumerate(self._depth_hits(inputs, parts.positions)):
                hits[k] += h
                counted[k] += m
            feature += float(parts.feature_loss) * parts.positions
            token += float(parts.token_loss) * parts.positions
            positions += parts.positions
        self.head.train()
        totals = self.dist.sum([feature, token, positions, *hits, *counted], self.device)
        feature, token, positions = totals[0], totals[1], int(totals[2])
        hits, counted = [int(x) for x in totals[3:3 + depths]], [int(x) for x in totals[3 + depths:]]
        n = max(positions, 1)
        weights = (c.feature_loss_weight, c.token_loss_weight) if self.head.predicts_features else (0.0, 1.0)
        row = {"kind": "eval", "step": self.step, "epoch": self.epoch, "examples": len(self.eval_idx),
               "positions": positions, "feature_loss": feature / n, "token_loss": token / n,
               "loss": (weights[0] * feature + weights[1] * token) / n}
        row.update({f"acc_depth{k + 1}": h / max(m, 1) for k, (h, m) in enumerate(zip(hits, counted))})
        return row

    # -- the loop -----------------------------------------------------------------------------
    def _accumulate(self, group: list[int]) -> list[float]:
        """Gradients of the mean loss over `group`, one optimizer step's sequences -> the step's
        [loss, feature loss, token loss] (means over the group). Data-parallel, this process takes
        its share and DDP sums the shares' gradients in the last micro-batch's backward."""
        world, size = self.dist.world_size, self.config.micro_batch
        mine = self.dist.shard(group)
        batches = [mine[i:i + size] for i in range(0, len(mine), size)]
        slots = math.ceil(math.ceil(len(group) / world) / size)  # micro-batches on every process: the largest share's
        losses = [0.0, 0.0, 0.0]
        for slot in range(slots):
            syncs = slot == slots - 1 or not isinstance(self.model, DistributedDataParallel)
            with contextlib.nullcontext() if syncs else self.model.no_sync():
                if slot < len(batches):
                    inputs = self._micro_batch(batches[slot])
                    parts = self.model(inputs, inputs.features)
                else:  # a short share: a zero gradient, so that this process joins the all-reduce
                    parts = self.model(None, None)
                (parts.loss * world / len(group)).backward()  # DDP divides the sum by world
            for k, v in enumerate((parts.loss, parts.feature_loss, parts.token_loss)):
                losses[k] += float(v.detach()) / len(group)
        return self.dist.sum(losses, self.device)

    def run(self) -> TrainResult:
        c = self.config
        if self._resume:
            self.load_checkpoint()
        if self.dist.enabled and not isinstance(self.model, DistributedDataParallel):
            # after the checkpoint: every process already holds the same weights and AdamW state
            self.model = DistributedDataParallel(self.model)
        self.head.train()
        bar = tqdm(total=self.total_steps, initial=self.step, unit="step", desc="train", disable=not self.progress,
                   dynamic_ncols=True)
        deadline = None if c.time_limit is None else time.monotonic() + 60 * c.time_limit
        started = self.step

        def out_of_time() -> bool:  # at least one step per run; every process stops at the same step
            if deadline is None or self.step == started:
                return False
            return self.dist.any(time.monotonic() > deadline, self.device)

        with bar:
            while self.step < self.total_steps and self.epoch < c.epochs and not out_of_time():
                order = epoch_order(self.train_idx, c.seed, self.epoch)
                while self.position < len(order) and self.step < self.total_steps and not out_of_time():
                    waited = wait_if_paused(self.out_dir, bar.write)  # a benchmark holds the machine, or PAUSE
                    if deadline is not None:
                        deadline += waited
                    group = order[self.position: self.position + c.grad_accum]
                    losses = self._accumulate(group)
                    if c.grad_clip > 0:
                        torch.nn.utils.clip_grad_norm_(self.head.parameters(), c.grad_clip)
                    self.optimizer.step()
                    self.scheduler.step()
                    self.optimizer.zero_grad(set_to_none=True)
                    self.step += 1
                    self.position += len(group)
                    self.window.append(losses)
                    bar.update(1)
                    bar.set_postfix(loss=f"{losses[0]:.4f}", epoch=self.epoch)
                    if self.step % c.log_every == 0 or self.step == self.total_steps:
                        mean = [sum(w[k] for w in self.window) / len(self.window) for k in range(3)]
                        self.history.append({"kind": "train", "step": self.step, "epoch": self.epoch,
                                             "loss": mean[0], "feature_loss": mean[1], "token_loss": mean[2],
                                             "lr": self.scheduler.get_last_lr()[0]})
                        self.window = []
                    if self.position >= len(order):
                        self._end_epoch()
                        break  # the next epoch has its own order
                    if self.step % c.checkpoint_every == 0:
                        self.save_checkpoint()
        idle()  # no more pause checks: benchmarks need not wait for the evaluation and saving below
        if (last_eval(self.history) or {}).get("step") != self.step:
            self._record_eval()
        unfinished = self.step < self.total_steps and self.epoch < c.epochs  # stopped by --time-limit
        if unfinished:
            self.save_checkpoint()  # the same command continues from here
        return self._finish(keep_checkpoint=unfinished)

    def _record_eval(self) -> None:
        if self.eval_idx:
            row = self.evaluate()
            self.history.append(row)
            if self.progress:
                tqdm.write(eval_line(row))

    def _end_epoch(self) -> None:
        self._record_eval()
        self.epoch += 1
        self.position = 0
        self.save_checkpoint()
        self._write_metrics(plot=True)

    def _finish(self, keep_checkpoint: bool = False) -> TrainResult:
        if self.dist.is_main:
            self._save(keep_checkpoint)
        self.dist.barrier()  # no process returns before the head is written
        if isinstance(self.model, DistributedDataParallel):
            # DDP's reducer holds the process group: freed now, not when the interpreter exits
            # (process_group leaves the group next; see there)
            self.model = self.model.module
        return TrainResult(self.head, self.out_dir, self.step, list(self.history))

    def _save(self, keep_checkpoint: bool) -> None:
        extra = {
            "trained_by": "eaglespec train",
            "target": self.target.identity(),
            "train_config": to_dict(self.config),
            "data": self.data_info,
            "split": {"train": len(self.train_idx), "eval": len(self.eval_idx)},
            "steps": self.step,
            "final_eval": last_eval(self.history),
        }
        self.head.save_pretrained(self.out_dir, extra=extra)
        if not self.head.own_vocabulary:
            vocab.save_draft_vocab(self.out_dir, self.counts)
        self._write_metrics(plot=True)
        if not keep_checkpoint:
            (self.out_dir / CHECKPOINT).unlink(missing_ok=True)

    def _write_metrics(self, plot: bool = False) -> None:
        if not self.dist.is_main:
            return
        atomic_write_bytes(self.out_dir / METRICS, "".join(json.dumps(r) + "\n" for r in self.history).encode())
        if plot:  # after every epoch and at the end: a plot per checkpoint would cost more than tiny steps
            plot_history(self.history, self.out_dir / PLOT)


def train(target, dataset, config: TrainConfig, out_dir, **kwargs) -> TrainResult:
    return Trainer(target, dataset, config, out_dir, **kwargs).run()


def eval_line(row: dict) -> str:
    accs = " ".join(f"d{k[9:]}={row[k]:.3f}" for k in row if k.startswith("acc_depth"))
    return (f"epoch {row['epoch']} step {row['step']}: held-out feature loss {row['feature_loss']:.4f}, "
            f"token loss {row['token_loss']:.4f}, top-1 accuracy {accs}")


def plot_history(history: list[dict], path: Path) -> None:
    """Losses against optimizer steps (left) and held-out top-1 accuracy per depth (right)."""
    if not history:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train_rows = [r for r in history if r["kind"] == "train"]
    eval_rows = [r for r in history if r["kind"] == "eval"]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for key, style in (("loss", "-"), ("feature_loss", "--"), ("token_loss", ":")):
        if not any(r[key] > 0 for r in train_rows + eval_rows):
            continue  # EAGLE-3 has no feature loss
        if train_rows:
            ax_loss.plot([r["step"] for r in train_rows], [r[key] for r in train_rows], style, label=f"train {key}")
        if eval_rows:
            ax_loss.plot([r["step"] for r in eval_rows], [r[key] for r in eval_rows], style + "o", label=f"held-out {key}")
    ax_loss.set_xlabel("optimizer step")
    ax_loss.set_yscale("log")
    ax_loss.legend(fontsize=7)
    depths = sorted(k for k in (eval_rows[0] if eval_rows else {}) if k.startswith("acc_depth"))
    for key in depths:
        ax_acc.plot([r["step"] for r in eval_rows], [r[key] for r in eval_rows], "o-", label=key.replace("acc_", ""))
    ax_acc.set_xlabel("optimizer step")
    ax_acc.set_ylabel("held-out top-1 accuracy")
    ax_acc.set_ylim(0, 1)
    if depths:
        ax_acc.legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)
