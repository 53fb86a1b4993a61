"""The one contract between the drafter and a draft head, and the loader that reads either kind.

A head (EAGLE-1: `head.EagleHead`, EAGLE-3: `eagle3.Eagle3Head`) offers
    kind            "eagle1" | "eagle3"
    hidden_layers   None: it reads the target's feature f (the LM-head input); else the ids of
                    the target layers whose residual streams it fuses (the target adapter returns
                    them, concatenated, from the forward it runs anyway)
    encode(a)       target states [..., k*H_t] -> the head's hidden input [..., H] (EAGLE-1: f itself)
    forward(embeds, hidden, attention_mask, position_ids, cache) -> o [B, T, H], fed back as the
                    hidden input of the next depth
    draft_lm(target, draft_vocab) -> DraftLM: o -> draft log-probabilities q, draft ids -> target ids
    cache_config    the config its KV cache is built from
so the drafter, the generation loop and the tuner never ask which kind they hold.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..errors import EagleError
from ..files import atomic_path, atomic_write_bytes

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"  # Hugging Face's sharded layout: weight_map tensor -> shard file
LEGACY_WEIGHTS = "pytorch_model.bin"
CONFIG = "config.json"


@dataclass(frozen=True)
class DraftLM:
    """The head's output layer: o -> log q over the draft vocabulary, and the ids' map back."""

    norm: nn.Module | None        # EAGLE-3's final norm; None for EAGLE-1 (o is a target feature)
    weight: torch.Tensor          # [Vd, H]
    bias: torch.Tensor | None     # [Vd]
    target_ids: torch.Tensor | None  # [Vd] target id of each draft id; None = the target's own ids

    def logprobs(self, out: torch.Tensor) -> torch.Tensor:
        """[M, H] -> [M, Vd] float32 log q."""
        x = self.norm(out) if self.norm is not None else out
        return torch.log_softmax(torch.nn.functional.linear(x, self.weight, self.bias).float(), dim=-1)

    def to_target_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return ids if self.target_ids is None else self.target_ids[ids]


def head_kind(cfg: dict, source: str) -> str:
    """'eagle1' or 'eagle3' from a head's config.json; anything else is a clear error."""
    archs = cfg.get("architectures") or []
    if any("eagle3" in str(a).lower() for a in archs) or "draft_vocab_size" in cfg or "eagle_config" in cfg:
        return "eagle3"
    if "hidden_size" in cfg and cfg.get("num_hidden_layers", 1) == 1:
        return "eagle1"
    raise EagleError(f"{source}: config.json describes neither an EAGLE-1 head (a target config with "
                     "num_hidden_layers 1) nor an EAGLE-3 head (architectures LlamaForCausalLMEagle3 or draft_vocab_size); "
                     f"got architectures={archs}, num_hidden_layers={cfg.get('num_hidden_layers')}")


def read_head_files(directory: str | os.PathLike) -> tuple[dict, dict[str, torch.Tensor], Path]:
    """(config dict, tensors, weights path) of a head directory, with one-line errors."""
    directory = Path(directory)
    if not directory.is_dir():
        raise EagleError(f"head directory {directory} does not exist: pass --head DIR (a folder with config.json and model.safetensors)")
    weights = directory / WEIGHTS
    if not weights.is_file() and (directory / INDEX).is_file():
        weights = directory / INDEX
    elif not weights.is_file() and (directory / LEGACY_WEIGHTS).is_file():
        weights = directory / LEGACY_WEIGHTS  # the official releases
    for path in (directory / CONFIG, weights):
        if not path.is_file():
            raise EagleError(f"head directory {directory} has no {path.name}: it is not an EAGLE head (expected config.json + model.safetensors)")
    try:
        cfg = json.loads((directory / CONFIG).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EagleError(f"{directory / CONFIG} is not valid JSON ({exc}); re-export the head") from exc
    if not isinstance(cfg, dict):
        raise EagleError(f"{directory / CONFIG} is not a JSON object; re-export the head")
    try:
        if weights.name == LEGACY_WEIGHTS:  # tensors only: never unpickle code
            sd = torch.load(weights, map_location="cpu", weights_only=True)
        elif weights.name == INDEX:
            shards = sorted(set(json.loads(weights.read_text())["weight_map"].values()))
            sd = {}
            for shard in shards:
                weights = directory / shard
                sd.update(load_file(weights))
        else:
            sd = load_file(weights)
    except Exception as exc:  # safetensors / torch raise their own error types for corrupt files
        raise EagleError(f"{weights} is not a readable weights file ({exc}); re-export the head") from exc
    return cfg, sd, weights


def load_head(directory: str | os.PathLike, target_config):
    """An EagleHead or Eagle3Head from `directory`, checked against the target."""
    from .eagle3 import Eagle3Head
    from .head import EagleHead

    cfg, sd, _ = read_head_files(directory)
    source = str(directory)
    if head_kind(cfg, source) == "eagle1":
        return EagleHead.from_files(cfg, sd, target_config, source)
    config = Eagle3Head.config_from_dict(cfg, target_config, source)
    config.check_target(target_config, source)
    d2t = sd.get("d2t")
    if d2t is not None and d2t.numel() != config.draft_vocab_size:
        raise EagleError(f"{source}: its d2t table has {d2t.numel()} entries but draft_vocab_size is "
                         f"{config.draft_vocab_size}: the head's files disagree; re-export it")
    t2d = sd.get("t2d")
    if t2d is not None and t2d.numel() != config.vocab_size:
        raise EagleError(f"{source}: its t2d table has {t2d.numel()} entries but the target vocabulary has "
                         f"{config.vocab_size}: it belongs to another target")
    head = Eagle3Head(config)
    head.load_eagle_state_dict(sd, source)
    return head


def write_head(directory: str | os.PathLike, cfg: dict, tensors: dict[str, torch.Tensor], extra: dict | None,
               max_shard_bytes: int | None = None) -> None:
    """config.json (+ our `eaglespec` block) and model.safetensors, each written atomically; with
    max_shard_bytes, Hugging Face's sharded layout (model-0000k-of-0000n.safetensors + index)
    when the tensors are larger, as every HF-format reader (vLLM, SGLang) accepts."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if extra:
        cfg = {**cfg, "eaglespec": extra}
    atomic_write_bytes(directory / CONFIG, json.dumps(cfg, indent=2, sort_keys=True, default=str).encode())
    sizes = {k: v.numel() * v.element_size() for k, v in tensors.items()}
    stale = [directory / WEIGHTS, directory / INDEX, *directory.glob("model-*-of-*.safetensors")]
    if max_shard_bytes is None or sum(sizes.values()) <= max_shard_bytes:
        with atomic_path(directory / WEIGHTS) as tmp:
            save_file(tensors, tmp, metadata={"format": "pt"})
        for path in stale[1:]:  # a reader must not find an older layout beside this one
            path.unlink(missing_ok=True)
        return
    shards: list[dict[str, torch.Tensor]] = [{}]
    for k, v in tensors.items():
        if shards[-1] and sum(sizes[n] for n in shards[-1]) + sizes[k] > max_shard_bytes:
            shards.append({})
        shards[-1][k] = v
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        with atomic_path(directory / name) as tmp:
            save_file(shard, tmp, metadata={"format": "pt"})
        weight_map.update({k: name for k in shard})
    index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}
    atomic_write_bytes(directory / INDEX, json.dumps(index, indent=2).encode())
    for path in stale:
        if path.name != INDEX and path.name not in weight_map.values():
            path.unlink(missing_ok=True)


def read_extra(directory: str | os.PathLike) -> dict:
    """The `eaglespec` block of a head's config.json (training summary, target identity)."""
    cfg = json.loads((Path(directory) / CONFIG).read_text())
    return cfg.get("eaglespec", {})
