"""From logits to the distribution p that decoding samples from (PURE).

The target's processed distribution p (temperature, then top-k, then top-p, as in HF and vLLM) is
the distribution that speculative sampling must reproduce exactly: verification works on p, never
on raw logits, so a lossless decoder and vanilla sampling agree on every setting. Greedy decoding
(temperature 0) is an argmax and is handled by the callers.
"""

import math

import torch


def logits_to_probs(
    logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """[..., V] logits -> [..., V] probabilities. top_k = 0 and top_p = 1.0 disable the filters."""
    return processed_scores(logits, temperature, top_k, top_p).softmax(dim=-1)


def processed_scores(
    logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """[..., V] logits -> [..., V] log p up to a constant per row: logits / temperature, -inf
    outside top-k and top-p (float32, float64 for float64 logits). softmax of it is p; reproducible
    sampling adds keyed Gumbel noise to it (core/noise.py)."""
    if not temperature > 0:
        raise ValueError(f"logits_to_probs needs temperature > 0, got {temperature}; use argmax")
    # Half-precision softmax loses the small probabilities that speculative sampling relies on.
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    scores = logits.to(dtype) / temperature
    vocab = scores.shape[-1]
    if 0 < top_k < vocab:
        kth = scores.topk(top_k, dim=-1).values[..., -1:]  # [..., 1]
        scores = scores.masked_fill(scores < kth, -math.inf)
    if top_p < 1.0:
        scores = scores.masked_fill(~_nucleus(scores.softmax(dim=-1), top_p), -math.inf)
    return scores


NUCLEUS_CANDIDATES = 256  # tokens ranked before falling back to sorting the whole vocabulary


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """[..., V] bool: the tokens top-p keeps. Rank tokens by probability (ties: lower id first);
    drop a token once the tokens ranked above it reach top_p. The best token has nothing above it,
    so at least one survives. Sorting 49k tokens per visited tree node costs ~4 ms on a CPU, so
    the NUCLEUS_CANDIDATES best are tried first (`_nucleus_from_candidates`)."""
    keep = _nucleus_from_candidates(probs, top_p, NUCLEUS_CANDIDATES)
    if keep is not None:
        return keep
    ranked, order = probs.sort(dim=-1, descending=True, stable=True)
    keep_ranked = ranked.cumsum(dim=-1) - ranked < top_p
    keep_ranked[..., 0] = True
    return keep_ranked.scatter(-1, order, keep_ranked)


def _nucleus_from_candidates(probs: torch.Tensor, top_p: float, m: int) -> torch.Tensor | None:
    """`_nucleus` from the m most likely tokens, or None when they cannot decide it. Let t be the
    (m+1)-th largest probability: every token above t is a candidate, in the full ranking's order
    once ties are put in id order. When the candidates above t already reach top_p, every token
    at or below t has at least that mass above it and is dropped, whatever its place among equals;
    the set is then exactly the full sort's (with top-k <= m this always holds: t is 0)."""
    m = min(m, probs.shape[-1] - 1)
    if m < 1:
        return None
    top = probs.topk(m + 1, dim=-1)
    edge = top.values[..., m:]                       # [..., 1] t
    ids, at = top.indices[..., :m].sort(dim=-1)      # ids ascending: the stable sort below breaks ties by id
    ranked, order = top.values[..., :m].gather(-1, at).sort(dim=-1, descending=True, stable=True)
    cum = ranked.cumsum(dim=-1)
    above = (ranked > edge).sum(dim=-1, keepdim=True)  # candidates strictly above t
    if not bool(((above > 0) & (cum.gather(-1, (above - 1).clamp(min=0)) >= top_p)).all()):
        return None
    keep_ranked = (cum - ranked < top_p) & (ranked > edge)
    keep_ranked[..., 0] = True
    return torch.zeros_like(probs, dtype=torch.bool).scatter(-1, ids.gather(-1, order), keep_ranked)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """[..., V] probabilities -> [...] long token ids."""
    flat = probs.reshape(-1, probs.shape[-1])  # [B, V]
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])
