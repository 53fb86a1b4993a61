"""The one contract between the drafter and a draft head, and the head-file helpers both kinds share.

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
    predicts_features  True: o is its prediction of the target's next feature f, trained by
                    regressing on f (plus the token loss) from teacher features (EAGLE-1); False: o
                    is its own state, trained on tokens alone by training-time test over its own
                    states (EAGLE-3)
    own_vocabulary  True: it drafts over a vocabulary of its own, kept with its weights (EAGLE-3's
                    d2t); False: over the target's, which a counted draft vocabulary may cut
so the drafter, the generation loop and the tuner never ask which kind they hold.

This module sits below both kinds (draft/head.py, draft/eagle3.py); the loader that must know
both (draft/heads.py) sits above them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..errors import EagleError, one_line
from ..files import atomic_path, atomic_write_bytes

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"  # Hugging Face's sharded layout: weight_map tensor -> shard file
LEGACY_WEIGHTS = "pytorch_model.bin"
CONFIG = "config.json"



def draft_logprobs(norm: nn.Module | None, weight: torch.Tensor, bias: torch.Tensor | None,
                   out: torch.Tensor) -> torch.Tensor:
    """A head's outputs [..., H] -> [..., Vd] float32 log q: DraftLM's product, also traced into
    the compiled path's draft-scores graph (engine/compiled.py)."""
    x = norm(out) if norm is not None else out
    return torch.log_softmax(torch.nn.functional.linear(x, weight, bias).float(), dim=-1)

@dataclass(frozen=True)
class DraftLM:
    """The head's output layer: o -> log q over the draft vocabulary, and the ids' map back."""

    norm: nn.Module | None        # EAGLE-3's final norm; None for EAGLE-1 (o is a target feature)
    weight: torch.Tensor          # [Vd, H]
    bias: torch.Tensor | None     # [Vd]
    target_ids: torch.Tensor | None  # [Vd] target id of each draft id; None = the target's own ids

    def logprobs(self, out: torch.Tensor) -> torch.Tensor:
        """[M, H] -> [M, Vd] float32 log q."""
        return draft_logprobs(self.norm, self.weight, self.bias, out)

    def to_target_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return ids if self.target_ids is None else self.target_ids[ids]

    def to(self, dtype: torch.dtype) -> "DraftLM":
        """This layer with its matrix and bias in `dtype` (a copy; itself when they are in it
        already): a head run in another dtype than the target's scores in its own."""
        if self.weight.dtype == dtype:
            return self
        bias = None if self.bias is None else self.bias.to(dtype)
        return DraftLM(self.norm, self.weight.to(dtype), bias, self.target_ids)


def rope_fields(cfg: dict) -> dict:
    """RoPE in every spelling a head's readers look for, from whichever one `cfg` has:
    `rope_theta` at the top level (the official EAGLE code and transformers 4 read it there and
    fall back to 10000 without it), transformers 5's `rope_parameters` (vLLM and SGLang read
    these) and the legacy `rope_scaling` (None for plain RoPE)."""
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    if "type" in rope and "rope_type" not in rope:  # the legacy spelling
        rope["rope_type"] = rope.pop("type")
    theta = float(cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0)
    rope.pop("rope_theta", None)
    rope.setdefault("rope_type", "default")
    scaling = None if rope["rope_type"] == "default" else rope
    return {"rope_theta": theta, "rope_parameters": {**rope, "rope_theta": theta}, "rope_scaling": scaling}


EAGLE1_MAX_LAYERS = 4  # an EAGLE-1 head's decoder layers: 1 in the paper; more is a draft model, not a head


def _layer_count(layers) -> bool:
    return type(layers) is int and 1 <= layers <= EAGLE1_MAX_LAYERS


def check_layers(layers) -> None:
    """Refuse an EAGLE-1 head's layer count outside 1..EAGLE1_MAX_LAYERS."""
    if not _layer_count(layers):
        raise EagleError(f"an EAGLE-1 head has 1 to {EAGLE1_MAX_LAYERS} decoder layers (the paper: 1), got {layers!r}")


def head_kind(cfg: dict, source: str) -> str:
    """'eagle1' or 'eagle3' from a head's config.json; anything else is a clear error."""
    archs = cfg.get("architectures") or []
    if any("eagle3" in str(a).lower() for a in archs) or "draft_vocab_size" in cfg or "eagle_config" in cfg:
        return "eagle3"
    if "hidden_size" in cfg and _layer_count(cfg.get("num_hidden_layers", 1)):
        return "eagle1"
    raise EagleError(f"{source}: config.json describes neither an EAGLE-1 head (a target config with "
                     f"num_hidden_layers 1 to {EAGLE1_MAX_LAYERS}) nor an EAGLE-3 head (architectures "
                     "LlamaForCausalLMEagle3 or draft_vocab_size); "
                     f"got architectures={archs}, num_hidden_layers={cfg.get('num_hidden_layers')}")


def config_and_weights(directory: str | os.PathLike) -> tuple[dict, Path]:
    """(config dict, weights path: model.safetensors, the sharded index or pytorch_model.bin)."""
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
    return cfg, weights


def shard_paths(index: Path) -> list[Path]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        return [index.parent / name for name in sorted(set(weight_map.values()))]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise EagleError(f"{index} is not a sharded-weights index ({one_line(exc)}); re-export the head") from exc


def read_head_files(directory: str | os.PathLike) -> tuple[dict, dict[str, torch.Tensor], Path]:
    """(config dict, tensors, weights path) of a head directory, with one-line errors."""
    cfg, weights = config_and_weights(directory)
    try:
        if weights.name == LEGACY_WEIGHTS:  # tensors only: never unpickle code
            sd = torch.load(weights, map_location="cpu", weights_only=True)
        elif weights.name == INDEX:
            sd = {}
            for shard in shard_paths(weights):
                weights = shard
                sd.update(load_file(shard))
        else:
            sd = load_file(weights)
    except EagleError:
        raise
    except Exception as exc:  # safetensors / torch raise their own error types for corrupt files
        raise EagleError(f"{weights} is not a readable weights file ({exc}); re-export the head") from exc
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise EagleError(f"{weights} holds no table of named tensors; re-export the head")
    return cfg, sd, weights


def _expected_shapes(cfg: dict, kind: str) -> list[tuple[str, int, str, int]]:
    """(config field(s), the size config.json implies, tensor, dimension) for every size a head's
    config.json states and its weights also carry; fields absent or not integers are skipped (the
    kind's own loader reports those)."""
    def num(key, default=None):
        value = cfg.get(key, default)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    h, heads, inter = num("hidden_size"), num("num_attention_heads"), num("intermediate_size")
    kv = num("num_key_value_heads") or heads
    head_dim = num("head_dim") or (h // heads if h and heads else None)
    layer = "layers.0." if kind == "eagle1" else "midlayer."
    rows = [("hidden_size", h, "fc.weight", 0),
            ("intermediate_size", inter, f"{layer}mlp.gate_proj.weight", 0),
            ("intermediate_size", inter, f"{layer}mlp.down_proj.weight", 1),
            ("num_attention_heads x head_dim", heads and head_dim and heads * head_dim, f"{layer}self_attn.q_proj.weight", 0),
            ("num_key_value_heads x head_dim", kv and head_dim and kv * head_dim, f"{layer}self_attn.k_proj.weight", 0)]
    if kind == "eagle1":
        rows.append(("hidden_size x 2 (embedding ; feature)", h and 2 * h, "fc.weight", 1))
    else:
        eagle = cfg.get("eagle_config") if isinstance(cfg.get("eagle_config"), dict) else {}
        ids = eagle.get("eagle_aux_hidden_state_layer_ids") or cfg.get("eagle_aux_hidden_state_layer_ids")
        fused = len(ids) if isinstance(ids, list) and ids else 3
        target_h = num("target_hidden_size") or h
        rows += [(f"target_hidden_size x {fused} fused layers", target_h and fused * target_h, "fc.weight", 1),
                 ("draft_vocab_size", num("draft_vocab_size") or num("vocab_size"), "lm_head.weight", 0)]
    return [row for row in rows if row[1]]


def check_config_against_weights(cfg: dict, kind: str, shapes: dict[str, tuple[int, ...]],
                                 directory: str | os.PathLike) -> None:
    """Refuse a head whose config.json states a size its tensors do not have (an edited or
    mismatched config.json would otherwise build a head the weights do not fill, or load silently)."""
    for field, expected, tensor, dim in _expected_shapes(cfg, kind):
        shape = shapes.get(tensor)
        if shape is not None and len(shape) > dim and shape[dim] != expected:
            raise EagleError(f"{Path(directory) / CONFIG}: {field} is {expected} but the weights have {shape[dim]} "
                             f"({tensor} has shape {shape}): config.json and the weights disagree; fix config.json "
                             "or re-export the head")
    if kind == "eagle1":
        stated = cfg.get("num_hidden_layers")
        held = len({k.split(".")[1] for k in shapes if k.startswith("layers.") and k.count(".") > 1})
        if held and held != (stated or 1):
            said = "absent (1)" if stated is None else stated
            raise EagleError(f"{Path(directory) / CONFIG}: num_hidden_layers is {said} but the weights hold {held} "
                             "decoder layers (layers.0 ...): config.json and the weights disagree; fix config.json "
                             "or re-export the head")


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
