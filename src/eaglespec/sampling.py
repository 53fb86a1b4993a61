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
        probs, order = scores.softmax(dim=-1).sort(dim=-1, descending=True, stable=True)
        # Drop a token once the tokens ranked above it already reach top_p; the best token has
        # nothing above it, so at least one token always survives.
        drop_sorted = probs.cumsum(dim=-1) - probs >= top_p  # [..., V]
        drop_sorted[..., 0] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, -math.inf)
    return scores.softmax(dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """[..., V] probabilities -> [...] long token ids."""
    flat = probs.reshape(-1, probs.shape[-1])  # [B, V]
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def validate_sampling(temperature: float, top_p: float, top_k: int) -> None:
    """Reject settings that have no meaning, with a message that names the fix."""
    if math.isnan(temperature) or temperature < 0:
        raise ValueError(
            f"temperature must be >= 0, got {temperature}; use 0 for greedy or a positive value"
        )
    if math.isnan(top_p) or not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}; use 1.0 to disable top-p")
    if math.isnan(top_k) or top_k < 0 or top_k != int(top_k):
        raise ValueError(f"top_k must be an integer >= 0, got {top_k}; use 0 to disable top-k")
