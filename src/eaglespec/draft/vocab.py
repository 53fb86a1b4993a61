"""A reduced draft vocabulary (EAGLE-3 / FR-Spec): the draft head's LM head only scores the most
frequent tokens of the training data. On a CPU the full 49k-row LM head is most of a draft step;
8k rows cover nearly all assistant tokens. Verification still uses the target's full vocabulary,
so the output is unchanged: a draft token outside the subset simply never gets proposed.

Stored beside the head as `draft_vocab.safetensors`: `token_ids` [V] (every target token id,
most frequent first) and `counts` [V]; the size is chosen at load time.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..errors import EagleError
from ..files import atomic_path

FILE = "draft_vocab.safetensors"
DEFAULT_SIZE = 8192


def count_tokens(sequences: Iterable[tuple[torch.Tensor, torch.Tensor]], vocab_size: int) -> torch.Tensor:
    """(input_ids [T], loss_mask [T]) pairs -> counts [V] of the tokens in the mask (the tokens the
    draft has to predict: assistant replies)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids, mask in sequences:
        counts += torch.bincount(ids[mask.bool()].long(), minlength=vocab_size)[:vocab_size]
    return counts


def save_draft_vocab(head_dir: str | Path, counts: torch.Tensor) -> Path:
    order = torch.sort(counts, descending=True, stable=True).indices
    path = Path(head_dir) / FILE
    with atomic_path(path) as tmp:
        save_file({"token_ids": order.contiguous(), "counts": counts.contiguous()}, tmp)
    return path


def load_draft_vocab(head_dir: str | Path, size: int | None, vocab_size: int) -> torch.Tensor | None:
    """-> d2t [size]: the `size` most frequent target ids, or None (full vocabulary) when the head
    ships no ranking, size is None, or size covers the whole vocabulary."""
    path = Path(head_dir) / FILE
    if size is None or not path.is_file():
        return None
    if size < 1:
        raise EagleError(f"draft vocabulary size must be >= 1, got {size}")
    ids = load_file(path)["token_ids"]
    if ids.numel() != vocab_size or int(ids.max()) >= vocab_size:
        raise EagleError(f"{path} ranks {ids.numel()} tokens but the target has {vocab_size}: it belongs to another target")
    return None if size >= vocab_size else ids[:size].clone()
