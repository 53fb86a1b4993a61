"""The head loader: reads a head directory of either kind (EAGLE-1 `head.EagleHead`, EAGLE-3
`eagle3.Eagle3Head`) and builds the head. The contract both kinds offer, and the file helpers
they share, are in draft/contract.py, below both; this module is above both, as it must know them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import EagleError, one_line
from .contract import INDEX, LEGACY_WEIGHTS, check_config_against_weights, config_and_weights, head_kind, read_head_files, shard_paths
from .eagle3 import Eagle3Head
from .head import EagleHead


def _header_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor shapes from a safetensors header, without reading the data."""
    from safetensors import safe_open

    try:
        with safe_open(path, "pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as exc:  # safetensors raises its own error types for a damaged header
        raise EagleError(f"{path} is not a readable weights file ({one_line(exc)}); re-export the head") from exc


@dataclass(frozen=True)
class HeadFiles:
    """What a head directory holds, read without loading its tensors (`inspect_head`)."""

    kind: str                           # "eagle1" | "eagle3"
    config: dict                        # config.json
    weights: Path                       # model.safetensors, the sharded index or pytorch_model.bin
    shapes: dict[str, tuple[int, ...]]  # tensor name -> shape


def inspect_head(directory: str | os.PathLike) -> HeadFiles:
    """Check a head directory in a second, before a target is loaded: config.json readable and of
    a known kind, the weights present with readable headers (safetensors) and shapes that agree
    with config.json. What needs the target (its sizes, its layers) is checked by `load_head`."""
    cfg, weights = config_and_weights(directory)
    kind = head_kind(cfg, str(directory))
    if weights.name == LEGACY_WEIGHTS:  # a pickle has no header: its tensors are read (mapped when it is a zip)
        try:
            try:
                sd = torch.load(weights, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError:  # torch's pre-1.6 format cannot be mapped
                sd = torch.load(weights, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise EagleError(f"{weights} is not a readable weights file ({one_line(exc)}); re-export the head") from exc
        if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
            raise EagleError(f"{weights} holds no table of named tensors; re-export the head")
        shapes = {k: tuple(v.shape) for k, v in sd.items()}
    elif weights.name == INDEX:
        shapes = {}
        for shard in shard_paths(weights):
            if not shard.is_file():
                raise EagleError(f"{shard} is missing (named in {weights.name}); copy the whole head directory")
            shapes.update(_header_shapes(shard))
    else:
        shapes = _header_shapes(weights)
    check_config_against_weights(cfg, kind, shapes, directory)
    return HeadFiles(kind, cfg, weights, shapes)


def load_head(directory: str | os.PathLike, target_config):
    """An EagleHead or Eagle3Head from `directory`, checked against the target."""
    cfg, sd, _ = read_head_files(directory)
    kind = head_kind(cfg, str(directory))
    check_config_against_weights(cfg, kind, {k: tuple(v.shape) for k, v in sd.items()}, directory)
    return head_from_files(cfg, sd, target_config, str(directory))


def own_target_config(cfg: dict, source: str):
    """An EAGLE-1 head's config.json is its target's config cut to one layer: the config the head
    is built from when no target is at hand (`eaglespec export` and `import` check a head alone)."""
    from transformers import AutoConfig

    fields = {k: v for k, v in cfg.items() if k not in ("model_type", "architectures", "eaglespec")}
    try:
        return AutoConfig.for_model(cfg.get("model_type", "llama"), **fields)
    except (KeyError, TypeError, ValueError) as exc:
        raise EagleError(f"{source}: its config.json does not describe a model transformers knows "
                         f"({one_line(exc)}); pass the target it was trained for") from exc


def head_from_files(cfg: dict, sd: dict[str, torch.Tensor], target_config, source: str):
    """An EagleHead or Eagle3Head from a config dict and its tensors, checked against the target;
    target_config None: against the head's own config.json."""
    kind = head_kind(cfg, source)
    if kind == "eagle1":
        return EagleHead.from_files(cfg, sd, target_config or own_target_config(cfg, source), source)
    config = Eagle3Head.config_from_dict(cfg, target_config, source)
    if target_config is not None:
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
