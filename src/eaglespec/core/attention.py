"""Attention masks handed to the stock Hugging Face forward.

A 4D float mask ([B, 1, q, kv], 0 = attend, dtype-min = blocked) is passed through HF's mask
creation untouched and works with both the eager and the SDPA attention implementations.
"""

import torch


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[q, kv] or [B, q, kv] bool -> [1 or B, 1, q, kv] additive float mask."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None] if mask.dim() == 2 else mask[:, None]


def tree_attention_mask(past_len: int, tree_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Queries are the N tree nodes; they see the whole cached past and their own ancestors.

    tree_mask: [N, N] bool (ancestor-or-self). Returns [1, 1, N, past_len + N].
    """
    n = tree_mask.shape[0]
    past = torch.ones(n, past_len, dtype=torch.bool, device=tree_mask.device)
    return additive_mask(torch.cat([past, tree_mask], dim=1), dtype)


def causal_mask(past_len: int, q_len: int, dtype: torch.dtype, device=None) -> torch.Tensor:
    """Ordinary causal attention for q_len new tokens on top of past_len cached ones."""
    tri = torch.ones(q_len, q_len, dtype=torch.bool, device=device).tril()
    return tree_attention_mask(past_len, tri, dtype)


def rows_tree_mask(past_valid: torch.Tensor, tree_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One tree per row after a shared cache: row r's N queries see the cached slots valid for it
    and their own ancestors.

    past_valid: [B, S] bool; tree_mask: [B, N, N] bool. Returns [B, 1, N, S + N]."""
    n = tree_mask.shape[1]
    past = past_valid[:, None, :].expand(-1, n, -1)
    return additive_mask(torch.cat([past, tree_mask], dim=2), dtype)
