"""The EAGLE-1 training loss, EAGLE-3's training-time-test loss, and the held-out accuracies.

Alignment, as in the official EAGLE code (its `input_ids` and `target` are the sequence shifted
left by one): for a sequence x[0..T-1] with target features f[0..T-1], position t in 0..T-2 gets
the input (embed(x[t+1]), f[t]) and predicts f_hat[t+1], regressed on f[t+1]. The target's
distribution p = softmax(lm_head(f[t+1])) and the draft's q = softmax(lm_head(f_hat[t+1])) are
both over x[t+2], so position t counts when x[t+2] is an assistant token: mask[t] =
loss_mask[t+2]. (The official code weights position t by loss_mask[t], two tokens early: it
never trains the first two tokens of a reply and trains on the two tokens after it. At inference
the head's first draft after a prompt predicts x[t+2] from (x[t+1], f[t]) exactly as here.)

    loss = w_f * SmoothL1(f_hat, f) + w_p * CE(p, q), each averaged over the masked positions.

A micro-batch of several sequences (`collate`: right-padded, the padding masked out) gives the
sum over its sequences of each one's loss, averaged over that sequence's own positions, so that
any micro-batch size takes the same optimizer step as one sequence at a time, up to float
rounding (a padded batch sums in another order). No real position sees the padding: under causal
attention none attends to a later one, and everything else works token by token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

from ..core.verify import greedy_ids


@dataclass
class HeadInputs:
    embeds: torch.Tensor    # [1, T-1, H] embed(x[t+1])
    features: torch.Tensor  # [1, T-1, H] f[t] (EAGLE-1), or [1, T-1, k*H] the fused layers a[t] (EAGLE-3)
    target: torch.Tensor    # [1, T-1, H] f[t+1]
    mask: torch.Tensor      # [1, T-1] bool: x[t+2] is an assistant token


@dataclass
class LossParts:
    loss: torch.Tensor          # scalar, differentiable: the sum over the sequences of each one's mean loss
    feature_loss: torch.Tensor  # scalar, detached (the same sum)
    token_loss: torch.Tensor    # scalar, detached (the same sum)
    correct: int                # masked positions where argmax q == argmax p (depth-1 top-1)
    positions: int              # masked positions


def head_inputs(input_ids: torch.Tensor, loss_mask: torch.Tensor, features: torch.Tensor, embed_tokens,
                dtype: torch.dtype, device, hidden: torch.Tensor | None = None) -> HeadInputs:
    """One captured sequence (ids [T], mask [T], f [T, H]) -> the head's shifted inputs and targets.
    hidden [T, k*H]: the fused target layers an EAGLE-3 head reads in place of f."""
    ids = input_ids.to(device)
    f = features.to(device=device, dtype=dtype)
    a = f if hidden is None else hidden.to(device=device, dtype=dtype)
    mask = torch.zeros_like(loss_mask, dtype=torch.bool)
    mask[:-2] = loss_mask[2:]
    with torch.no_grad():
        embeds = embed_tokens(ids[1:]).to(dtype)
    return HeadInputs(embeds[None], a[None, :-1], f[None, 1:], mask[None, :-1].to(device))


def collate(batch: list[HeadInputs]) -> HeadInputs:
    """Sequences [1, T_i, ...] -> one right-padded micro-batch [B, max T_i, ...]; the padding
    (zeros) is masked out."""
    if len(batch) == 1:
        return batch[0]
    return HeadInputs(*(pad_sequence([getattr(x, name)[0] for x in batch], batch_first=True)
                        for name in ("embeds", "features", "target", "mask")))


def _per_sequence_sum(values: torch.Tensor, rows: torch.Tensor, batch: int) -> torch.Tensor:
    """values [N] at the masked positions of sequences rows [N] (ascending) -> the sum over the
    sequences of each one's mean (a sequence without positions adds 0). One sequence: values.mean()."""
    if batch == 1:
        return values.mean()
    sums = values.new_zeros(batch).index_add(0, rows, values)
    counts = torch.bincount(rows, minlength=batch).clamp(min=1)
    return (sums / counts).sum()


def _logits(lm_head, x: torch.Tensor) -> torch.Tensor:
    return lm_head(x.to(lm_head.weight.dtype)).float()


def eagle_loss(predicted: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, lm_head,
               feature_weight: float = 1.0, token_weight: float = 0.1) -> LossParts:
    """predicted, target [B, T, H]; mask [B, T] bool. Only masked positions go through the LM head."""
    pred, tgt = predicted[mask], target[mask]  # [N, H], sequence by sequence
    n = pred.shape[0]
    if n == 0:
        zero = predicted.sum() * 0.0
        return LossParts(zero, zero.detach(), zero.detach(), 0, 0)
    rows, batch = mask.nonzero()[:, 0], mask.shape[0]
    feature_loss = _per_sequence_sum(
        F.smooth_l1_loss(pred.float(), tgt.float(), reduction="none").mean(-1), rows, batch)
    with torch.no_grad():
        target_logits = _logits(lm_head, tgt)  # [N, V]
        p = target_logits.softmax(-1)
    draft_logits = _logits(lm_head, pred)      # [N, V]
    token_loss = _per_sequence_sum(-(p * draft_logits.log_softmax(-1)).sum(-1), rows, batch)
    correct = int((greedy_ids(draft_logits) == greedy_ids(target_logits)).sum())  # max: argmax's index, ~4x cheaper
    loss = feature_weight * feature_loss + token_weight * token_loss
    return LossParts(loss, feature_loss.detach(), token_loss.detach(), correct, n)


@torch.no_grad()
def rollout_correct(head, inputs: HeadInputs, lm_head, depths: int) -> list[int]:
    """Teacher-forced top-1 hits at draft depths 1..depths (tokens are the real ones; features
    are the head's own from depth 2 on).

    Depth k at position t feeds the head its depth-(k-1) prediction of f[t], which is the output
    at position t-1, so one shifted forward per depth covers the whole sequence. Its attention
    context is the head's own features too, a little harsher than inference, where the context
    before the draft holds real features. Position 0 keeps the real f[0] (no earlier prediction)."""
    mask = inputs.mask
    wanted = greedy_ids(_logits(lm_head, inputs.target[mask]))  # [N]
    features, hits = inputs.features, []
    for _ in range(depths):
        predicted = head(inputs.embeds, features)  # [1, T-1, H]
        hits.append(int((greedy_ids(_logits(lm_head, predicted[mask])) == wanted).sum()))
        features = torch.cat([inputs.features[:, :1], predicted[:, :-1].to(features.dtype)], dim=1)
    return hits


@dataclass
class StepParts:
    loss: torch.Tensor       # scalar, differentiable: sum over steps of decay**k * CE_k (and over sequences)
    token_loss: torch.Tensor  # scalar, detached: the same sum
    step_loss: list[float]   # CE_k per step (summed over sequences)
    correct: list[int]       # per step: masked positions where the draft's top-1 is the target's top-1
    positions: list[int]     # per step: masked positions


def ttt_loss(head, inputs: HeadInputs, target_lm, steps: int, decay: float,
             wanted: torch.Tensor | None = None) -> StepParts:
    """EAGLE-3's training-time test: the head unrolled `steps` times on its own outputs.

    inputs.features holds the fused target layers a[t] (column t reads embed(x[t+1]) and a[t]).
    Step k at column t is the depth-(k+1) draft from a context ending at t: it reads
    embed(x[t+1+k]) and the step-(k-1) output, sees what `Eagle3Head.ttt_step` describes, and is
    scored against the target's distribution p over x[t+k+2] (from f[t+k+1], `inputs.target` at
    column t+k), renormalised over the draft vocabulary (`target_lm` holds the target's LM-head
    rows for the head's draft ids, in draft-id order). Columns whose x[t+k+2] is not an assistant
    token, or lies past the sequence, do not count. `wanted` [T-1]: the target's top-1 over its
    full vocabulary at each column (for accuracies; default: the top-1 over the draft vocabulary).
    A micro-batch (`collate`) gives the sum over its sequences of each one's loss; `wanted` is then
    [B, T-1].
    """
    embeds, mask = inputs.embeds, inputs.mask
    batch, n = mask.shape
    with torch.no_grad():
        p_logits = _logits(target_lm, inputs.target)  # [B, T-1, Vd]
        p = p_logits.softmax(-1)
        if wanted is None:
            wanted = head.target_ids()[greedy_ids(p_logits)]
        wanted = wanted.reshape(batch, n)
    hidden = head.encode(inputs.features)
    keys, values = [], []
    total = embeds.new_zeros((), dtype=torch.float32)
    parts = StepParts(total, total, [], [], [])
    ids = head.target_ids()
    for k in range(min(steps, n)):
        e = torch.cat([embeds[:, k:], embeds.new_zeros(batch, k, embeds.shape[-1])], dim=1)  # x[t+1+k]; tail unread
        positions = torch.arange(k, n + k, device=embeds.device)[None]
        hidden = head.ttt_step(e, hidden, positions, keys, values)
        rows, cols = mask[:, k:].nonzero().unbind(-1)  # (sequence, column t) with x[t+k+2] an assistant token
        if cols.numel() == 0:
            parts.step_loss.append(0.0)
            parts.correct.append(0)
            parts.positions.append(0)
            continue
        logq = head.lm_head(head.norm(hidden[rows, cols])).float().log_softmax(-1)  # [M, Vd]
        ce = _per_sequence_sum(-(p[rows, cols + k] * logq).sum(-1), rows, batch)
        total = total + decay ** k * ce
        parts.step_loss.append(float(ce.detach()))
        parts.correct.append(int((ids[greedy_ids(logq)] == wanted[rows, cols + k]).sum()))
        parts.positions.append(int(cols.numel()))
    parts.loss, parts.token_loss = total, total.detach()
    return parts
