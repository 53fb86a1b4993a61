"""A reduced draft vocabulary (EAGLE-3 / FR-Spec): the draft head's LM head only scores the most
frequent tokens of the training data. On a CPU the full 49k-row LM head is most of a draft step;
8k rows cover nearly all assistant tokens. Verification still uses the target's full vocabulary,
so the output is unchanged: a draft token outside the subset simply never gets proposed.

Stored beside the head as `draft_vocab.safetensors`: `token_ids` [V] (every target token id,
most frequent first) and `counts` [V]; the size is chosen at load time. A head exported for
another engine keeps it in an `eaglespec/` subfolder instead, since vLLM and SGLang load every
`*.safetensors` beside the weights as weights; both places are read.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..errors import EagleError, one_line
from ..files import atomic_path

FILE = "draft_vocab.safetensors"
EXPORTED_DIR = "eaglespec"  # where an exported head keeps it (interop/formats.py)
TOKEN_IDS = "token_ids"
DEFAULT_SIZE = 4096  # with the context tokens (drafter.Drafter.context_vocab): docs/benchmarks.md, session 41


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
        save_file({TOKEN_IDS: order.contiguous(), "counts": counts.contiguous()}, tmp)
    return path


def vocab_path(head_dir: str | Path) -> Path:
    """The head's draft_vocab.safetensors: beside the weights, else in the exported layout's
    subfolder; the first when neither exists."""
    beside = Path(head_dir) / FILE
    exported = Path(head_dir) / EXPORTED_DIR / FILE
    return exported if not beside.is_file() and exported.is_file() else beside


def _unreadable(path: Path, why: str) -> EagleError:
    head_dir = path.parent.parent if path.parent.name == EXPORTED_DIR else path.parent
    return EagleError(f"{path} {why}: rebuild it with `eaglespec tune --head {head_dir} --recount`, or delete it "
                      "(the head then drafts over the full vocabulary)")


def check_draft_vocab(head_dir: str | Path) -> None:
    """Read only the header of a head's draft_vocab.safetensors (if it has one): a damaged file,
    or one without `token_ids` [V], is refused before anything slow is loaded."""
    from safetensors import safe_open

    path = vocab_path(head_dir)
    if not path.is_file():
        return
    try:
        with safe_open(path, "pt") as f:
            shape = f.get_slice(TOKEN_IDS).get_shape() if TOKEN_IDS in f.keys() else None
    except Exception as exc:  # safetensors raises its own error types for a damaged header
        raise _unreadable(path, f"is not a readable safetensors file ({one_line(exc)})") from exc
    if shape is None:
        raise _unreadable(path, f"has no {TOKEN_IDS!r} tensor")
    if len(shape) != 1:
        raise _unreadable(path, f"holds {TOKEN_IDS!r} of shape {tuple(shape)}, not a list of token ids")


def load_draft_vocab(head_dir: str | Path, size: int | None, vocab_size: int) -> torch.Tensor | None:
    """-> d2t [size]: the `size` most frequent target ids, or None (full vocabulary) when the head
    ships no ranking, size is None, or size covers the whole vocabulary."""
    path = vocab_path(head_dir)
    if size is None or not path.is_file():
        return None
    if size < 1:
        raise EagleError(f"draft vocabulary size must be >= 1, got {size}")
    check_draft_vocab(head_dir)
    try:
        ids = load_file(path)[TOKEN_IDS]
    except Exception as exc:  # a header that reads but data cut short
        raise _unreadable(path, f"is not a readable safetensors file ({one_line(exc)})") from exc
    if ids.is_floating_point() or ids.is_complex():
        raise _unreadable(path, f"holds {TOKEN_IDS!r} as {ids.dtype}, not integer token ids")
    if ids.numel() != vocab_size or int(ids.max()) >= vocab_size or int(ids.min()) < 0:
        raise EagleError(f"{path} ranks {ids.numel()} tokens but the target has {vocab_size}: it belongs to another target")
    return None if size >= vocab_size else ids[:size].clone()
