"""The EAGLE-3 draft head (Li, Wei, Zhang, Zhang, 2025: "EAGLE-3: Scaling up Inference Acceleration
of Large Language Models via Training-Time Test"), in the layout the published heads, SpecForge,
vLLM and SGLang use (`LlamaForCausalLMEagle3`).

    g[t]  = fc([a_low[t] ; a_mid[t] ; a_high[t]])        3 target layers (3H_t) -> H, no bias
    u     = [input_layernorm(embed(x[t+1])) ; hidden_norm(g[t])]                         [2H]
    h     = g[t] + o_proj(Attn(q_proj(u), k_proj(u), v_proj(u)))     attention input 2H wide
    o[t]  = h + mlp(post_attention_layernorm(h))
    q(x[t+2]) = softmax(lm_head(norm(o[t])))             over the draft vocabulary (Vd tokens)

a_l[t] is the target's residual stream entering decoder layer l (vLLM's
`eagle_aux_hidden_state_layer_ids`: 0 = the embeddings). A deeper draft feeds o[t] back in
place of g (the fc is skipped). Draft token i is target token i + d2t[i]; t2d marks the target
tokens that have a draft id. The embedding is the target's, frozen and not stored.

The attention is written here rather than borrowed from a decoder layer because its input is
2H wide, and because training-time test (`ttt_attention`) needs a pattern that no stock module
offers; everything else (norms, MLP, rotary embedding) is transformers' Llama code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import EagleError
from .contract import DraftLM, rope_fields, write_head

ARCHITECTURE = "LlamaForCausalLMEagle3"


def default_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's and vLLM's choice (2, L/2, L-3), kept inside a shallow target."""
    return (min(2, num_layers - 1), num_layers // 2, max(num_layers - 3, 0))


@dataclass(frozen=True)
class Eagle3Config:
    hidden_size: int              # H: the head's width (the target's)
    target_hidden_size: int       # H_t: width of each fused target layer
    intermediate_size: int        # MLP width
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    vocab_size: int               # the target's vocabulary
    draft_vocab_size: int         # Vd: rows of the head's own LM head
    layer_ids: tuple[int, ...]    # target layers fused by fc
    rope_scaling: dict | None = None  # the target's RoPE scaling (Llama 3 style), if any
    hidden_act: str = "silu"

    @classmethod
    def for_target(cls, target_config, draft_vocab_size: int, layer_ids=None) -> "Eagle3Config":
        tc = target_config
        n_layers = tc.num_hidden_layers
        ids = tuple(layer_ids) if layer_ids is not None else default_layer_ids(n_layers)
        rope = dict(getattr(tc, "rope_parameters", None) or {})
        theta = rope.pop("rope_theta", None) or getattr(tc, "rope_theta", None) or 10000.0
        scaling = rope if rope.get("rope_type", "default") != "default" else None
        intermediate = getattr(tc, "intermediate_size", None) or 4 * tc.hidden_size
        return cls(hidden_size=tc.hidden_size, target_hidden_size=tc.hidden_size, intermediate_size=intermediate,
                   num_attention_heads=tc.num_attention_heads,
                   num_key_value_heads=getattr(tc, "num_key_value_heads", None) or tc.num_attention_heads,
                   head_dim=getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads,
                   rms_norm_eps=getattr(tc, "rms_norm_eps", 1e-6), rope_theta=float(theta),
                   max_position_embeddings=tc.max_position_embeddings, vocab_size=tc.vocab_size,
                   draft_vocab_size=draft_vocab_size, layer_ids=ids, rope_scaling=scaling,
                   hidden_act=getattr(tc, "hidden_act", "silu"))

    def llama_config(self):
        """The one-layer LlamaConfig that builds the norms, MLP, rotary embedding and head cache."""
        from transformers import LlamaConfig

        rope = {"rope_type": "default", **(self.rope_scaling or {}), "rope_theta": self.rope_theta}
        cfg = LlamaConfig(hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
                          num_hidden_layers=1, num_attention_heads=self.num_attention_heads,
                          num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim,
                          rms_norm_eps=self.rms_norm_eps, max_position_embeddings=self.max_position_embeddings,
                          vocab_size=self.vocab_size, hidden_act=self.hidden_act, rope_parameters=rope,
                          tie_word_embeddings=False)
        return cfg

    def check_target(self, target_config, source: str) -> None:
        n = target_config.num_hidden_layers
        bad = [i for i in self.layer_ids if not 0 <= i < n]
        if bad:
            raise EagleError(f"{source}: EAGLE-3 layer ids {list(self.layer_ids)} include {bad}, but the target has "
                             f"{n} layers (ids 0..{n - 1}); the head was trained for a deeper target")
        for what, name, ours in (("target_hidden_size", "hidden_size", self.target_hidden_size),
                                 ("hidden_size (its width, the embedding's)", "hidden_size", self.hidden_size),
                                 ("vocab_size", "vocab_size", self.vocab_size)):
            theirs = getattr(target_config, name)
            if ours != theirs:
                raise EagleError(f"{source}: the EAGLE-3 head has {what}={ours} but the target has {name}={theirs}: "
                                 "it was trained for another target")


class _Attention(nn.Module):
    """Grouped-query attention over a 2H-wide input, tensor names as the published heads."""

    def __init__(self, c: Eagle3Config):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(2 * c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)

    def qkv(self, u: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """u [B, T, 2H] -> q [B, nh, T, d], k and v [B, nkv, T, d] (RoPE applied)."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        b, t, _ = u.shape
        q = self.q_proj(u).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(u).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(u).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v

    def out(self, attn: torch.Tensor) -> torch.Tensor:
        """[B, nh, T, d] -> [B, T, H]."""
        b, _, t, _ = attn.shape
        return self.o_proj(attn.transpose(1, 2).reshape(b, t, -1))

    def expand(self, kv: torch.Tensor) -> torch.Tensor:
        return kv.repeat_interleave(self.n_heads // self.n_kv, dim=1)


class _MidLayer(nn.Module):
    def __init__(self, c: Eagle3Config, llama_config):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

        self.input_layernorm = LlamaRMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.self_attn = _Attention(c)
        self.post_attention_layernorm = LlamaRMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.mlp = LlamaMLP(llama_config)


class Eagle3Head(nn.Module):
    """One head interface with `EagleHead` (EAGLE-1): `hidden_layers`, `encode`, `forward`,
    `draft_lm`; see draft/contract.py."""

    kind = "eagle3"
    predicts_features = False  # o is the head's own state, trained by training-time test (draft/contract.py)
    own_vocabulary = True  # d2t, saved with the weights

    def __init__(self, config: Eagle3Config):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

        self.config = config
        self.llama_config = self.cache_config = config.llama_config()
        self.hidden_size = config.hidden_size
        self.hidden_layers = tuple(config.layer_ids)
        self.fc = nn.Linear(len(config.layer_ids) * config.target_hidden_size, config.hidden_size, bias=False)
        self.midlayer = _MidLayer(config, self.llama_config)
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        self.rotary = LlamaRotaryEmbedding(self.llama_config)
        # draft id i -> target id i + d2t[i]; t2d[v]: target token v has a draft id
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))

    # -- the draft vocabulary -----------------------------------------------------------------
    def set_draft_vocab(self, target_ids: torch.Tensor) -> None:
        """target_ids [Vd]: the target tokens the head drafts; stored ascending, as the official code."""
        ids = torch.sort(target_ids.to(torch.long).flatten()).values
        if ids.numel() != self.config.draft_vocab_size or ids.unique().numel() != ids.numel():
            raise EagleError(f"a draft vocabulary needs {self.config.draft_vocab_size} distinct target ids, got {ids.numel()}")
        self.d2t.copy_(ids - torch.arange(ids.numel()))
        self.t2d.zero_()
        self.t2d[ids] = True

    def target_ids(self) -> torch.Tensor:
        """[Vd] target id of every draft id."""
        return self.d2t + torch.arange(self.d2t.numel(), device=self.d2t.device)

    # -- forward ------------------------------------------------------------------------------
    def encode(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """[..., 3H_t] fused target layers -> [..., H] (the fc)."""
        return self.fc(target_hidden.to(self.fc.weight.dtype))

    def _inputs(self, embeds: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor):
        m = self.midlayer
        u = torch.cat([m.input_layernorm(embeds.to(hidden.dtype)), m.hidden_norm(hidden)], dim=-1)  # [B, T, 2H]
        cos, sin = self.rotary(u, position_ids)
        return u, cos, sin

    def _finish(self, hidden: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        m = self.midlayer
        h = hidden + m.self_attn.out(attn)
        return h + m.mlp(m.post_attention_layernorm(h))

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        """embeds [B, T, H] = embed(x[t+1]), hidden [B, T, H] (fc output or an earlier o) -> o [B, T, H].

        attention_mask: None for causal over the new tokens (and everything cached), else an
        additive [B, 1, T, kv] mask. position_ids: [B, T], default after the cache."""
        b, t, _ = hidden.shape
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + t, device=hidden.device)[None].expand(b, t)
        u, cos, sin = self._inputs(embeds, hidden, position_ids)
        attn_mod = self.midlayer.self_attn
        q, k, v = attn_mod.qkv(u, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, 0)
        causal = attention_mask is None and t > 1
        if causal and past:
            allowed = torch.ones(t, past + t, dtype=torch.bool, device=q.device).tril(past)
            attention_mask, causal = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill(
                ~allowed, torch.finfo(q.dtype).min), False
        attn = F.scaled_dot_product_attention(q, attn_mod.expand(k), attn_mod.expand(v), attn_mask=attention_mask,
                                              is_causal=causal)
        return self._finish(hidden, attn)

    def ttt_step(self, embeds: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor,
                 keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
        """One training-time-test step over a whole sequence, without a cache.

        Step j (j = len(keys) before the call) at column t stands for the depth-(j+1) draft whose
        real context ends at t: it sees the step-0 (real) keys of columns 0..t, the keys of steps
        1..j-1 at column t (its own draft ancestors) and itself, exactly what the drafter's
        tree mask gives that node. keys/values collect every step's [B, nkv, T, d] (appended)."""
        u, cos, sin = self._inputs(embeds, hidden, position_ids)
        attn_mod = self.midlayer.self_attn
        q, k, v = attn_mod.qkv(u, cos, sin)
        keys.append(k)
        values.append(v)
        k0, v0 = attn_mod.expand(keys[0]), attn_mod.expand(values[0])
        scale = 1.0 / math.sqrt(q.shape[-1])
        t = q.shape[2]
        scores = (q @ k0.transpose(-1, -2)) * scale  # [B, nh, T, T]
        causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~causal, torch.finfo(scores.dtype).min)
        diag = [((q * attn_mod.expand(kj)).sum(-1, keepdim=True) * scale) for kj in keys[1:]]  # [B, nh, T, 1]
        all_scores = torch.cat([scores, *diag], dim=-1)  # [B, nh, T, T + j]
        weights = all_scores.to(torch.promote_types(q.dtype, torch.float32)).softmax(-1).to(q.dtype)
        attn = weights[..., :t] @ v0
        for j, vj in enumerate(values[1:]):
            attn = attn + weights[..., t + j:t + j + 1] * attn_mod.expand(vj)
        return self._finish(hidden, attn)

    def draft_lm(self, target, draft_vocab=None) -> DraftLM:
        if draft_vocab is not None:
            raise EagleError("an EAGLE-3 head drafts over its own vocabulary (d2t): pass no draft_vocab")

        return DraftLM(self.norm, self.lm_head.weight, None, self.target_ids())

    # -- checkpoint format --------------------------------------------------------------------
    def eagle_state_dict(self) -> dict[str, torch.Tensor]:
        sd = {k: v for k, v in self.state_dict().items() if not k.startswith("rotary.")}
        return {k: v.detach().contiguous().cpu() for k, v in sd.items()}

    def load_eagle_state_dict(self, sd: dict[str, torch.Tensor], source: str = "head") -> None:
        expected = self.eagle_state_dict()
        if "d2t" not in sd and self.config.draft_vocab_size == self.config.vocab_size:  # no reduced vocabulary
            sd = {**sd, "d2t": torch.zeros_like(self.d2t), "t2d": torch.ones_like(self.t2d)}
        if "d2t" in sd and "t2d" not in sd:  # some writers keep d2t only: t2d follows from it
            t2d = torch.zeros_like(self.t2d)
            ids = sd["d2t"].long() + torch.arange(sd["d2t"].numel())
            t2d[ids.clamp(0, t2d.numel() - 1)] = True
            sd = {**sd, "t2d": t2d}
        missing = sorted(set(expected) - set(sd))
        if missing:
            raise EagleError(f"{source}: missing tensors {missing[:4]}{'...' if len(missing) > 4 else ''}; "
                             "not a complete EAGLE-3 head")
        for k, v in expected.items():
            if tuple(sd[k].shape) != tuple(v.shape):
                raise EagleError(f"{source}: tensor {k} has shape {tuple(sd[k].shape)}, its config needs "
                                 f"{tuple(v.shape)}: config.json and the weights disagree")
        d2t = sd["d2t"].to(torch.long)
        ids = d2t + torch.arange(d2t.numel())
        if int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size:
            raise EagleError(f"{source}: its d2t table maps draft ids to {int(ids.min())}..{int(ids.max())}, outside the "
                             f"target vocabulary 0..{self.config.vocab_size - 1}")
        if ids.unique().numel() != ids.numel():
            raise EagleError(f"{source}: its d2t table maps two draft ids to the same target token; re-export the head")
        state = {k: sd[k] for k in expected}
        state["d2t"], state["t2d"] = d2t, sd["t2d"].to(torch.bool)
        self.load_state_dict(state, strict=False)

    def save_pretrained(self, directory, extra: dict | None = None, max_shard_bytes: int | None = None) -> None:
        tensors = self.eagle_state_dict()
        if self.config.draft_vocab_size == self.config.vocab_size:  # no tables: vLLM has nothing to load d2t into
            tensors = {k: v for k, v in tensors.items() if k not in ("d2t", "t2d")}
        write_head(directory, self.config_dict(), tensors, extra, max_shard_bytes)

    def config_dict(self) -> dict:
        """config.json as the published EAGLE-3 heads and SpecForge write it (Llama fields, one layer),
        read as is by vLLM (SGLang counts layer ids otherwise: `eaglespec export --format sglang`;
        docs/interop.md). `bias: false` is the fc's (SGLang and the official code read it so),
        `attention_bias: false` the attention's; `tie_word_embeddings: false` keeps SGLang from
        replacing lm_head by the embedding."""
        c = self.config
        dtype = str(self.fc.weight.dtype).removeprefix("torch.")
        rope = rope_fields({"rope_theta": c.rope_theta, "rope_scaling": c.rope_scaling})
        return {
            "architectures": [ARCHITECTURE], "model_type": "llama", "num_hidden_layers": 1,
            "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
            "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
            "head_dim": c.head_dim, "rms_norm_eps": c.rms_norm_eps, **rope,
            "max_position_embeddings": c.max_position_embeddings,
            "vocab_size": c.vocab_size, "draft_vocab_size": c.draft_vocab_size,
            "target_hidden_size": c.target_hidden_size, "hidden_act": c.hidden_act,
            "tie_word_embeddings": False, "attention_bias": False, "bias": False,
            "torch_dtype": dtype, "dtype": dtype,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(c.layer_ids), "use_aux_hidden_state": True},
            # the same ids where vLLM looks first and llama.cpp's converter only (its input-of-layer indexing is ours)
            "eagle_aux_hidden_state_layer_ids": list(c.layer_ids),
        }

    @classmethod
    def config_from_dict(cls, cfg: dict, target_config, source: str) -> Eagle3Config:
        """A published / SpecForge / our config.json -> Eagle3Config; layer ids default to (2, L/2, L-3).
        target_config None: the head's own config.json must state every size (`eaglespec import`)."""
        eagle = cfg.get("eagle_config") or {}
        ids = eagle.get("eagle_aux_hidden_state_layer_ids") or cfg.get("eagle_aux_hidden_state_layer_ids")
        ours = cfg.get("eaglespec") if isinstance(cfg.get("eaglespec"), dict) else {}
        if ours.get("layer_ids") is not None:  # an export whose engine counts layers otherwise (SGLang)
            ids = ours["layer_ids"]
        if cfg.get("norm_before_residual"):
            raise EagleError(f"{source}: norm_before_residual=true (a variant whose residual is the normed hidden state) "
                             "is not supported; only the published EAGLE-3 layout is")
        rope = rope_fields(cfg)
        theta, scaling = rope["rope_theta"], rope["rope_scaling"]

        def target(name):  # a default taken from the target; without one the field must be there
            if target_config is None:
                raise KeyError(name)
            return getattr(target_config, name)

        try:
            h = int(cfg["hidden_size"])
            heads = int(cfg["num_attention_heads"])
            return Eagle3Config(
                hidden_size=h, target_hidden_size=int(cfg.get("target_hidden_size") or h),
                intermediate_size=int(cfg["intermediate_size"]), num_attention_heads=heads,
                num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or h // heads), rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                rope_theta=float(theta),
                max_position_embeddings=int(cfg.get("max_position_embeddings") or target("max_position_embeddings")),
                vocab_size=int(cfg.get("vocab_size") or target("vocab_size")),
                draft_vocab_size=int(cfg.get("draft_vocab_size") or cfg.get("vocab_size") or target("vocab_size")),
                layer_ids=tuple(int(i) for i in ids) if ids else default_layer_ids(target("num_hidden_layers")),
                rope_scaling=scaling, hidden_act=cfg.get("hidden_act", "silu"))
        except (KeyError, TypeError, ValueError) as exc:
            raise EagleError(f"{source}: its EAGLE-3 config.json lacks or mangles {exc}; re-export the head") from exc
