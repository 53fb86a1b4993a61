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
import os

import torch
from torch import nn

from ..errors import EagleError
from .heads import DraftLM, check_config_against_weights, read_head_files, write_head


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
    """See draft/heads.py for the interface it shares with `Eagle3Head`."""

    kind = "eagle1"
    hidden_layers = None  # reads the target's feature f

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
        self.cache_config = decoder.config

    def encode(self, features: torch.Tensor) -> torch.Tensor:
        """EAGLE-1 reads f itself."""
        return features

    def draft_lm(self, target, draft_vocab: torch.Tensor | None = None) -> DraftLM:
        """The target's LM head, cut to `draft_vocab` [Vd] (target ids) when one is given."""
        weight, bias = target.lm_head.weight, getattr(target.lm_head, "bias", None)
        if draft_vocab is None:
            return DraftLM(None, weight, bias, None)
        draft_vocab = draft_vocab.to(weight.device)
        return DraftLM(None, weight[draft_vocab].contiguous(), None if bias is None else bias[draft_vocab], draft_vocab)

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

    def save_pretrained(self, directory: str | os.PathLike, extra: dict | None = None,
                        max_shard_bytes: int | None = None) -> None:
        """config.json (the target's config with one layer, as the published heads have) +
        model.safetensors, each written atomically."""
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        cfg = self.target_config.to_dict()
        # The published EAGLE-1 heads carry the target's config with one layer and `bias: true`;
        # vLLM and SGLang pick their EAGLE model class from `architectures`.
        arch = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(cfg.get("model_type"))
        cfg.update(num_hidden_layers=1, bias=True, architectures=cfg.get("architectures") or ([arch] if arch else None))
        cfg.pop("layer_types", None)
        write_head(directory, cfg, self.eagle_state_dict(), extra, max_shard_bytes)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, target_config) -> "EagleHead":
        cfg, sd, _ = read_head_files(directory)
        check_config_against_weights(cfg, cls.kind, {k: tuple(v.shape) for k, v in sd.items()}, directory)
        return cls.from_files(cfg, sd, target_config, str(directory))

    @classmethod
    def from_files(cls, cfg: dict, sd: dict[str, torch.Tensor], target_config, source: str) -> "EagleHead":
        for key in ("hidden_size", "vocab_size"):
            theirs, ours = cfg.get(key), getattr(target_config, key)
            if theirs is not None and theirs != ours:
                raise EagleError(f"head {source} has {key}={theirs} but the target has {key}={ours}: it was trained for another target")
        head = cls(target_config)
        head.load_eagle_state_dict(sd, source=source)
        return head


