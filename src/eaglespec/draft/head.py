"""The EAGLE-1 draft head.

    f_hat[t+1] = Layer( fc( [embed(x[t+1]) ; f[t]] ) )

`fc` maps 2h -> h (with bias); `Layer` is one decoder layer of the target's own family (taken
from `transformers`, not copied) without its input norm, and there is no final norm. Draft logits
are the target's LM head applied to f_hat. Embedding and LM head belong to the target and are
not stored: the saved tensors carry the published EAGLE-1 names (`fc.weight`, `fc.bias`,
`layers.0.self_attn.q_proj.weight`, ...), so heads load in the official code, vLLM and SGLang.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..errors import EagleError
from ..files import atomic_path, atomic_write_bytes

WEIGHTS = "model.safetensors"
LEGACY_WEIGHTS = "pytorch_model.bin"
CONFIG = "config.json"


def _head_config(target_config):
    """The target's config cut to one layer, with the attention that runs anywhere (SDPA)."""
    cfg = copy.deepcopy(target_config)
    cfg.num_hidden_layers = 1
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = list(cfg.layer_types[:1])
    cfg.vocab_size = 1  # the decoder's own embedding is never used: keep it tiny
    cfg.pad_token_id = None
    cfg.tie_word_embeddings = False
    cfg._attn_implementation = "sdpa"
    return cfg


class EagleHead(nn.Module):
    def __init__(self, target_config):
        super().__init__()
        from transformers import AutoModel

        h = target_config.hidden_size
        self.hidden_size = h
        self.target_config = target_config
        self.fc = nn.Linear(2 * h, h, bias=True)
        decoder = AutoModel.from_config(_head_config(target_config))
        if not hasattr(decoder, "layers") or not hasattr(decoder, "norm"):
            raise EagleError(f"{target_config.model_type}: its base model has no `layers`/`norm`; the EAGLE head cannot be built from it")
        decoder.norm = nn.Identity()
        decoder.layers[0].input_layernorm = nn.Identity()
        decoder.embed_tokens = None
        self.decoder = decoder

    def forward(self, embeds: torch.Tensor, features: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        """embeds [B, T, H] = embed(x[t+1]), features [B, T, H] = f[t] -> predicted f[t+1] [B, T, H].

        attention_mask: None for plain causal (training), else a 4D additive mask [B, 1, T, kv]."""
        x = self.fc(torch.cat([embeds, features.to(embeds.dtype)], dim=-1))
        out = self.decoder(inputs_embeds=x, attention_mask=attention_mask, position_ids=position_ids,
                           cache=cache, use_cache=cache is not None)
        return out.last_hidden_state

    # -- checkpoint format --------------------------------------------------------------------
    def eagle_state_dict(self) -> dict[str, torch.Tensor]:
        sd = {f"fc.{k}": v for k, v in self.fc.state_dict().items()}
        sd.update({f"layers.{k}": v for k, v in self.decoder.layers.state_dict().items()})
        return {k: v.detach().contiguous().cpu() for k, v in sd.items()}

    def load_eagle_state_dict(self, sd: dict[str, torch.Tensor], source: str = "head") -> None:
        expected = self.eagle_state_dict()
        missing = sorted(set(expected) - set(sd))
        if missing:
            raise EagleError(f"{source}: missing tensors {missing[:4]}{'...' if len(missing) > 4 else ''}; not an EAGLE-1 head for this target")
        for k, v in expected.items():
            if tuple(sd[k].shape) != tuple(v.shape):
                raise EagleError(
                    f"{source}: tensor {k} has shape {tuple(sd[k].shape)}, this target needs {tuple(v.shape)}; "
                    "the head was trained for a different target model"
                )
        self.fc.load_state_dict({k[3:]: sd[k] for k in expected if k.startswith("fc.")})
        self.decoder.layers.load_state_dict({k[7:]: sd[k] for k in expected if k.startswith("layers.")})

    def save_pretrained(self, directory: str | os.PathLike, extra: dict | None = None) -> None:
        """config.json (the target's config with one layer, as the published heads have) +
        model.safetensors, each written atomically."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        cfg = self.target_config.to_dict()
        # The published EAGLE-1 heads carry the target's config with one layer and `bias: true`;
        # vLLM and SGLang pick their EAGLE model class from `architectures`.
        arch = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(cfg.get("model_type"))
        cfg.update(num_hidden_layers=1, bias=True, architectures=cfg.get("architectures") or ([arch] if arch else None))
        cfg.pop("layer_types", None)
        if extra:
            cfg["eaglespec"] = extra
        atomic_write_bytes(directory / CONFIG, json.dumps(cfg, indent=2, sort_keys=True, default=str).encode())
        with atomic_path(directory / WEIGHTS) as tmp:
            save_file(self.eagle_state_dict(), tmp, metadata={"format": "pt"})

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, target_config) -> "EagleHead":
        directory = Path(directory)
        if not directory.is_dir():
            raise EagleError(f"head directory {directory} does not exist: pass --head DIR (a folder with config.json and model.safetensors)")
        weights = directory / WEIGHTS
        if not weights.is_file() and (directory / LEGACY_WEIGHTS).is_file():
            weights = directory / LEGACY_WEIGHTS  # the official EAGLE-1 releases
        for path in (directory / CONFIG, weights):
            if not path.is_file():
                raise EagleError(f"head directory {directory} has no {path.name}: it is not an EAGLE head (expected config.json + model.safetensors)")
        try:
            cfg = json.loads((directory / CONFIG).read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise EagleError(f"{directory / CONFIG} is not valid JSON ({exc}); re-export the head") from exc
        for key in ("hidden_size", "vocab_size"):
            theirs, ours = cfg.get(key), getattr(target_config, key)
            if theirs is not None and theirs != ours:
                raise EagleError(f"head {directory} has {key}={theirs} but the target has {key}={ours}: it was trained for another target")
        try:
            if weights.name == LEGACY_WEIGHTS:  # tensors only: never unpickle code
                sd = torch.load(weights, map_location="cpu", weights_only=True)
            else:
                sd = load_file(weights)
        except Exception as exc:  # safetensors / torch raise their own error types for corrupt files
            raise EagleError(f"{weights} is not a readable weights file ({exc}); re-export the head") from exc
        head = cls(target_config)
        head.load_eagle_state_dict(sd, source=str(directory))
        return head

    @staticmethod
    def read_extra(directory: str | os.PathLike) -> dict:
        cfg = json.loads((Path(directory) / CONFIG).read_text())
        return cfg.get("eaglespec", {})

