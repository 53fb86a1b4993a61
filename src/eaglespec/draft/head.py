"""The EAGLE-1 draft head.

    f_hat[t+1] = Layers( fc( [embed(x[t+1]) ; f[t]] ) )

`fc` maps 2h -> h (with a bias, as the paper; `fc_bias=False` as the LLaMA-3 releases and vLLM);
`Layers` is one decoder layer of the target's own family (taken from `transformers`, not copied)
without its input norm, as the paper, or `layers` of them, the first without its input norm (as
vLLM's and SGLang's EAGLE-1 models build a head of config.json's `num_hidden_layers`); there is no
final norm. Draft logits are the target's LM head applied to f_hat. Embedding and LM head belong
to the target and are not stored: the saved tensors carry the published EAGLE-1 names (`fc.weight`, `fc.bias`,
`layers.0.self_attn.q_proj.weight`, ...); what each engine needs beyond that is written by
`eaglespec export` (interop/, docs/interop.md).
"""

from __future__ import annotations

import copy
import os

import torch
from torch import nn

from ..errors import EagleError
from .contract import DraftLM, check_config_against_weights, check_layers, read_head_files, rope_fields, write_head

# Fields of the target's config.json that must not travel with a head: a reader applies them to the
# head (vLLM and SGLang would load it as a GGUF-quantised model; `bias` is the official code's fc
# bias but vLLM's and SGLang's attention bias; a head's layers are all of its target's first layer's
# type, so it has no per-layer types), and paths name this machine.
_NOT_COPIED = ("quantization_config", "bias", "layer_types", "eaglespec")


def eagle1_config(cfg: dict, fc_bias: bool, dtype: torch.dtype | None = None, layers: int = 1) -> dict:
    """An EAGLE-1 head's config.json from its target's config (or an older head's): the target's
    fields with the head's `layers` (one, as the published heads), and nothing a reader can misread. `bias` is
    written only when false: the official code reads a missing `bias` as true (its fc bias), and
    vLLM and SGLang read a true one as attention bias; `tie_word_embeddings` is false (SGLang
    would use its embedding as the LM head)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    out = {k: v for k, v in cfg.items() if k not in _NOT_COPIED and not k.startswith("_")}
    arch = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(out.get("model_type"))
    out.update(num_hidden_layers=layers, tie_word_embeddings=False,
               architectures=[arch] if arch else out.get("architectures"), **rope_fields(cfg))
    if not fc_bias:
        out["bias"] = False
    if dtype is not None:
        out["torch_dtype"] = out["dtype"] = str(dtype).removeprefix("torch.")
    return out


def _head_config(target_config, layers: int):
    """The target's config cut to `layers` layers, each of its first layer's type, with the
    attention that runs anywhere (SDPA)."""
    cfg = copy.deepcopy(target_config)
    cfg.num_hidden_layers = layers
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = list(cfg.layer_types[:1]) * layers
    cfg.vocab_size = 1  # the decoder's own embedding is never used: keep it tiny
    cfg.pad_token_id = None
    cfg.tie_word_embeddings = False
    cfg._attn_implementation = "sdpa"
    return cfg


class EagleHead(nn.Module):
    """See draft/contract.py for the interface it shares with `Eagle3Head`."""

    kind = "eagle1"
    hidden_layers = None  # reads the target's feature f
    predicts_features = True  # o is a prediction of f (draft/contract.py)
    own_vocabulary = False  # the target's vocabulary, or a counted draft vocabulary beside the weights

    def __init__(self, target_config, fc_bias: bool = True, layers: int = 1):
        super().__init__()
        from transformers import AutoModel

        check_layers(layers)
        h = target_config.hidden_size
        self.hidden_size = h
        self.target_config = target_config
        self.fc = nn.Linear(2 * h, h, bias=fc_bias)
        decoder = AutoModel.from_config(_head_config(target_config, layers))
        if not hasattr(decoder, "layers") or not hasattr(decoder, "norm"):
            raise EagleError(f"{target_config.model_type}: its base model has no `layers`/`norm`; the EAGLE head cannot be built from it")
        decoder.norm = nn.Identity()
        decoder.layers[0].input_layernorm = nn.Identity()
        decoder.embed_tokens = None
        self.decoder = decoder
        self.cache_config = decoder.config

    @property
    def layers(self) -> int:
        return len(self.decoder.layers)

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
        if missing and any(k.startswith("model.layers.") for k in sd):  # a whole HF model of 1-4 layers
            raise EagleError(f"{source}: holds a whole model (model.layers.*), not an EAGLE-1 head (fc, layers.*): "
                             "pass a model as --target and a draft head as --head")
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
        """config.json (`eagle1_config`: the target's config with the head's layers, one as the
        published heads have) + model.safetensors, each written atomically."""
        cfg = eagle1_config(self.target_config.to_dict(), self.fc.bias is not None, self.fc.weight.dtype, self.layers)
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
        # no fc bias: the LLaMA-3 releases and vLLM's heads; layers: config.json's, as vLLM and SGLang read it
        head = cls(target_config, fc_bias="fc.bias" in sd, layers=cfg.get("num_hidden_layers", 1))
        head.load_eagle_state_dict(sd, source=source)
        return head




_RESIDUAL_OUTPUTS = ("o_proj", "down_proj")  # the last product of a layer's attention and MLP (experts') branches


@torch.no_grad()
def grow_head(head: EagleHead, given: EagleHead, source: str) -> None:
    """`head` holds `given`'s fc and layers, and has more layers: each added layer starts as the
    identity, the output projections of its attention and MLP (every parameter named o_proj or
    down_proj, a mixture's fused experts' included, and their biases) zero, so that the grown head
    drafts as `given` does. Checked on a random input, which catches a family whose layers have
    other names: an EagleError."""
    for layer in head.decoder.layers[given.layers:]:
        for name, param in layer.named_parameters():
            if any(part in _RESIDUAL_OUTPUTS for part in name.split(".")):
                param.zero_()
    rng = torch.Generator().manual_seed(0)
    embeds, features = (torch.randn(1, 5, head.hidden_size, generator=rng) for _ in range(2))
    # either may be bf16, or on a GPU; eval: no dropout
    grown, was = (copy.deepcopy(h).to("cpu", torch.float32).eval() for h in (head, given))
    if not torch.allclose(grown(embeds, features), was(embeds, features), rtol=1e-4, atol=1e-5):
        raise EagleError(f"--init-from {source}: a {head.target_config.model_type} head's added layers do not start as "
                         f"the identity with their {', '.join(_RESIDUAL_OUTPUTS)} zero; train the {head.layers}-layer head "
                         "from a fresh initialisation (no --init-from)")
