"""Frozen, self-describing configs for capture and training; the CLI flags are derived from them.

Every field carries its help text in `metadata["help"]`; `from_dict` rejects unknown keys, and
`to_dict` is what manifests, checkpoints and trained heads record.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field, fields

from ..draft.contract import check_layers
from ..errors import EagleError

FEATURE_DTYPES = ("bf16", "fp16", "fp32")


def _opt(default, help: str, **extra):
    return field(default=default, metadata={"help": help, **extra})


@dataclass(frozen=True)
class DataConfig:
    """Which conversations become examples, and how long ones are handled."""

    data: str = _opt("sharegpt", "conversations: a .json/.jsonl file in ShareGPT (conversations/from/value) or "
                     "OpenAI (messages/role/content) format, or 'sharegpt' for the packaged ShareGPT corpus")
    max_examples: int | None = _opt(None, "stop after this many usable examples (default: all)")
    max_length: int = _opt(2048, "longest example in tokens")
    overflow: str = _opt("truncate", "what to do with a conversation longer than --max-length",
                         choices=("truncate", "skip"))

    def __post_init__(self) -> None:
        if self.max_length < 4:
            raise EagleError(f"max_length={self.max_length} is too short: pass --max-length 4 or more")
        if self.max_examples is not None and self.max_examples < 1:
            raise EagleError(f"max_examples={self.max_examples}: pass a positive count or leave it unset")
        _check_choice(self, "overflow")


@dataclass(frozen=True)
class CaptureConfig(DataConfig):
    """Data options plus how captured features are stored."""

    feature_dtype: str = _opt("bf16", "storage dtype of the captured features", choices=FEATURE_DTYPES,
                              aliases=("--dtype",))
    shard_size: int = _opt(64, "examples per shard file (the unit of resumption)")
    loop_cut: int = _opt(0, "stop each reply's loss after the first repeat of a stretch of this many tokens, so "
                            "that the rest of a looping reply (common in greedy distilled replies) stops "
                            "outweighing the text around it (default 0: off; 16 is a choice)")
    aux_layers: str | None = _opt(None, "also store the residual streams entering these target layers, for EAGLE-3 "
                                  "heads: 'auto' (2, L/2, L-3, as EAGLE-3 and vLLM) or ids such as 2,15,27 "
                                  "(default: none, EAGLE-1 only)")

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_choice(self, "feature_dtype")
        if self.aux_layers is not None:
            parse_layers(self.aux_layers, None)
        if self.shard_size < 1:
            raise EagleError(f"shard_size={self.shard_size}: pass --shard-size 1 or more")
        if self.loop_cut != 0 and self.loop_cut < 2:
            raise EagleError(f"loop_cut={self.loop_cut}: pass --loop-cut 0 (off) or a stretch of 2 tokens or more")


@dataclass(frozen=True)
class DistillConfig(DataConfig):
    """Data options plus how the target regenerates the assistant turns (self-distilled data).
    --max-examples counts conversations kept; a prompt longer than --max-length ends its
    conversation before that turn (--overflow skip drops the whole conversation instead)."""

    max_new_tokens: int = _opt(512, "longest regenerated reply in tokens")
    temperature: float = _opt(0.0, "sampling temperature (0 = greedy)")
    top_p: float = _opt(1.0, "nucleus sampling mass (with --temperature > 0)")
    seed: int = _opt(0, "sampling seed (each generate call is seeded from it, the chunk, the turn and the batch)")
    batch_size: int = _opt(8, "prompts generated together, left-padded: the same turn of as many conversations of a "
                           "chunk, longest prompts first")
    max_turns: int | None = _opt(None, "regenerate only the first N assistant turns; the conversation ends after "
                                 "the N-th (default: all)")
    chunk_size: int = _opt(64, "conversations per output chunk file (the unit of resumption)")

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("max_new_tokens", "batch_size", "chunk_size"):
            if getattr(self, name) < 1:
                raise EagleError(f"{name}={getattr(self, name)}: pass --{_flag(name)} 1 or more")
        if self.temperature < 0:
            raise EagleError(f"temperature={self.temperature} is negative: pass --temperature 0 (greedy) or more")
        if not 0.0 < self.top_p <= 1.0:
            raise EagleError(f"top_p={self.top_p}: pass --top-p in (0, 1] (1 = off)")
        if self.max_turns is not None and self.max_turns < 1:
            raise EagleError(f"max_turns={self.max_turns}: pass a positive count or leave it unset")


def parse_layers(text: str, num_layers: int | None) -> tuple[int, ...] | None:
    """'auto' -> EAGLE-3's (2, L/2, L-3) once L is known (None before); '2,15,27' -> (2, 15, 27)."""
    if text == "auto":
        if num_layers is None:
            return None
        from ..draft.eagle3 import default_layer_ids

        return default_layer_ids(num_layers)
    try:
        ids = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise EagleError(f"layer ids {text!r}: pass 'auto' or comma-separated layer numbers such as 2,15,27") from None
    if not ids or min(ids) < 0 or (num_layers is not None and max(ids) >= num_layers):
        raise EagleError(f"layer ids {text!r} must be in 0..{'L-1' if num_layers is None else num_layers - 1}"
                         + ("" if num_layers is None else f" (the target has {num_layers} layers)"))
    return ids


HEAD_KINDS = ("eagle1", "eagle3")


@dataclass(frozen=True)
class TrainConfig:
    """The EAGLE-1 training recipe (Li et al., 2024, section 4) and EAGLE-3's (training-time
    test, token loss only, its own draft vocabulary): defaults are the papers'."""

    head: str = _opt("eagle1", "the head to train: eagle1 (feature + token loss on f) or eagle3 (fused target "
                     "layers, training-time test, own draft vocabulary)", choices=HEAD_KINDS)
    fc_bias: bool = _opt(True, "eagle1: give the head's fc a bias, as the paper; --no-fc-bias trains one without, as the "
                         "LLaMA-3 releases, which vLLM runs exactly (its EAGLE-1 fc has no bias; docs/interop.md)")
    head_layers: int = _opt(1, "eagle1: decoder layers in the head (the paper: 1; up to 4). --init-from a head of "
                            "fewer layers grows it: its layers come first, each new one starts as the identity "
                            "(its output projections zero), so the grown head drafts as the given one did")
    ttt_steps: int = _opt(7, "eagle3: training-time-test steps, the head unrolled on its own outputs (1 = no "
                          "training-time test)")
    ttt_decay: float = _opt(0.8, "eagle3: step k's loss is weighted decay**k (the official EAGLE-3 code)")
    draft_vocab_size: int = _opt(8192, "eagle3: the head's own vocabulary, the most frequent assistant tokens "
                                 "of the training split")
    aux_layers: str = _opt("auto", "eagle3: target layers fused by the head ('auto' = 2, L/2, L-3); with "
                           "--capture-dir it must be what the capture stored")
    epochs: int = _opt(1, "passes over the training split")
    lr: float = _opt(3e-5, "peak AdamW learning rate")
    beta1: float = _opt(0.9, "AdamW beta1")
    beta2: float = _opt(0.95, "AdamW beta2")
    weight_decay: float = _opt(0.0, "AdamW weight decay")
    grad_accum: int = _opt(8, "sequences per optimizer step, the global batch: under torchrun they are dealt to the "
                           "processes, so the step is the same for any process count (a multiple of the process "
                           "count keeps every process busy)",
                           aliases=("--batch",))
    micro_batch: int = _opt(1, "sequences per forward, right-padded: the step is the same for any size (each "
                            "sequence's loss is averaged over its own positions), only the arithmetic is grouped "
                            "otherwise; raise it on a GPU, where one ~700-token sequence leaves it idle. A "
                            "checkpoint resumes under any size")
    warmup: int = _opt(100, "optimizer steps of linear learning-rate warm-up")
    schedule: str = _opt("linear", "learning rate after warm-up: 'linear' decay to 0 at the last step "
                         "(the official EAGLE code) or 'constant'", choices=("linear", "constant"))
    noise: float | None = _opt(None, "input features get uniform noise U(-noise, noise) during training (default: "
                               "0.1 for eagle1, as the paper; 0 for eagle3, whose training-time test replaces it)")
    feature_loss_weight: float = _opt(1.0, "weight of the SmoothL1 feature-regression loss")
    token_loss_weight: float = _opt(0.1, "weight of the cross-entropy against the target's token distribution")
    grad_clip: float = _opt(0.5, "clip the gradient's global norm to this (0: no clipping)")
    loss_vocab: int | None = _opt(None, "score the token loss over only the N most frequent assistant tokens of the "
                                  "training split, the reduced draft vocabulary used at inference (EAGLE-3 / "
                                  "FR-Spec); default: the full vocabulary, as the paper. About 6x less LM-head work")
    eval_fraction: float = _opt(0.05, "fraction of examples held out for evaluation")
    eval_first: int | None = _opt(None, "hold out the first N examples instead of a seeded eval_fraction: the same "
                                  "held-out set whatever the data's size, for runs on a capture that grows "
                                  "(default: unset, a seeded fraction of the whole data)")
    eval_depths: int = _opt(4, "report teacher-forced top-1 accuracy at draft depths 1..N")
    train_examples: int | None = _opt(None, "train on only the first N examples of the training split (in data "
                                      "order); the held-out split stays the one of the whole data set, so runs "
                                      "on several data sizes are evaluated on the same examples (default: all)")
    max_steps: int | None = _opt(None, "stop after this many optimizer steps in total (default: all epochs)")
    time_limit: float | None = _opt(None, "stop after this many minutes of training in this run (checked after every "
                                    "optimizer step), then evaluate and save the head and a checkpoint: the same "
                                    "command continues (the schedule is the full run's) (default: none)")
    seed: int = _opt(0, "seed of the head's initialisation, the split, the data order and the noise")
    init_from: str | None = _opt(None, "start from this head's weights instead of a fresh initialisation (continued "
                                 "training): a head folder or a shipped head's name, of the kind and sizes --head and "
                                 "the target give. Hold out the examples it was trained with held out (--eval-first), "
                                 "or its held-out figures are not held out (default: a fresh head)")
    checkpoint_every: int = _opt(50, "optimizer steps between checkpoints (one is also written after every epoch)")
    log_every: int = _opt(10, "optimizer steps between training-loss lines in metrics.jsonl")

    def __post_init__(self) -> None:
        _check_choice(self, "schedule")
        _check_choice(self, "head")
        parse_layers(self.aux_layers, None)
        check_layers(self.head_layers)
        if self.head == "eagle3" and self.head_layers != 1:
            raise EagleError(f"head_layers={self.head_layers}: an EAGLE-3 head has one decoder layer; --head-layers is "
                             "for --head eagle1")
        if self.ttt_decay <= 0:
            raise EagleError(f"ttt_decay={self.ttt_decay}: pass --ttt-decay above 0")
        for name in ("epochs", "grad_accum", "micro_batch", "eval_depths", "checkpoint_every", "log_every",
                     "ttt_steps", "draft_vocab_size"):
            if getattr(self, name) < 1:
                raise EagleError(f"{name}={getattr(self, name)}: pass --{_flag(name)} 1 or more")
        for name in ("lr", "grad_clip", "weight_decay", "warmup", "feature_loss_weight", "token_loss_weight"):
            if getattr(self, name) < 0:
                raise EagleError(f"{name}={getattr(self, name)} is negative: pass --{_flag(name)} 0 or more")
        if self.noise is not None and self.noise < 0:
            raise EagleError(f"noise={self.noise} is negative: pass --noise 0 or more")
        if not 0.0 <= self.eval_fraction < 1.0:
            raise EagleError(f"eval_fraction={self.eval_fraction}: pass --eval-fraction in [0, 1)")
        if self.loss_vocab is not None and self.loss_vocab < 1:
            raise EagleError(f"loss_vocab={self.loss_vocab}: pass a positive count or leave it unset")
        if self.time_limit is not None and self.time_limit <= 0:
            raise EagleError(f"time_limit={self.time_limit}: pass a positive number of minutes or leave it unset")
        if self.eval_first is not None and self.eval_first < 1:
            raise EagleError(f"eval_first={self.eval_first}: pass a positive count or leave it unset")
        if self.train_examples is not None and self.train_examples < 1:
            raise EagleError(f"train_examples={self.train_examples}: pass a positive count or leave it unset")
        if self.max_steps is not None and self.max_steps < 1:
            raise EagleError(f"max_steps={self.max_steps}: pass a positive count or leave it unset")


    @property
    def feature_noise(self) -> float:
        return self.noise if self.noise is not None else (0.1 if self.head == "eagle1" else 0.0)


# -- dict round trip --------------------------------------------------------------------------
def to_dict(config) -> dict:
    return dataclasses.asdict(config)


def from_dict(cls, data: dict, source: str = "config"):
    """Build `cls` from a dict; unknown keys are an error, missing keys take their defaults."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise EagleError(f"{source}: unknown {cls.__name__} option(s) {unknown}; known: {sorted(known)}")
    return cls(**data)


# -- argparse derived from the dataclass ------------------------------------------------------
def _flag(name: str) -> str:
    return name.replace("_", "-")


_TYPES = {"int": int, "float": float, "str": str, "bool": bool}


def _base_type(annotation: str) -> type:
    """The field's type without `| None` (annotations are strings under `from __future__`)."""
    return _TYPES[next(p.strip() for p in annotation.split("|") if p.strip() != "None")]


def add_config_arguments(parser: argparse.ArgumentParser, cls, title: str | None = None) -> None:
    """One `--flag-name` per field of `cls`, with its type, choices, default and help."""
    group = parser.add_argument_group(title or cls.__name__)
    for f in fields(cls):
        base = _base_type(f.type)
        text = f.metadata.get("help", "")
        kwargs = {"dest": f.name, "default": f.default,
                  "help": text if "default" in text else f"{text} (default: {f.default})"}
        if base is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = base
            kwargs["metavar"] = base.__name__.upper()
        if "choices" in f.metadata:
            kwargs["choices"] = f.metadata["choices"]
            kwargs.pop("metavar", None)
        group.add_argument(f"--{_flag(f.name)}", *f.metadata.get("aliases", ()), **kwargs)


def config_from_args(cls, args: argparse.Namespace):
    return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


def _check_choice(config, name: str) -> None:
    choices = next(f for f in fields(config) if f.name == name).metadata["choices"]
    value = getattr(config, name)
    if value not in choices:
        raise EagleError(f"{name}={value!r}: choose one of {', '.join(choices)}")
