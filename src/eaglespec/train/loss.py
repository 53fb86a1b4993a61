"""The EAGLE-1 training loss and the held-out accuracies.

Alignment, as in the official EAGLE code (its `input_ids` and `target` are the sequence shifted
left by one): for a sequence x[0..T-1] with target features f[0..T-1], position t in 0..T-2 gets
the input (embed(x[t+1]), f[t]) and predicts f_hat[t+1], regressed on f[t+1]. The target's
distribution p = softmax(lm_head(f[t+1])) and the draft's q = softmax(lm_head(f_hat[t+1])) are
both over x[t+2], so position t counts when x[t+2] is an assistant token: mask[t] =
loss_mask[t+2]. (The official code weights position t by loss_mask[t], two tokens early: it
never trains the first two tokens of a reply and trains on the two tokens after it. At inference
the head's first draft after a prompt predicts x[t+2] from (x[t+1], f[t]) exactly as here.)

    loss = w_f * SmoothL1(f_hat, f) + w_p * CE(p, q), each averaged over the masked positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class HeadInputs:
    embeds: torch.Tensor    # [1, T-1, H] embed(x[t+1])
    features: torch.Tensor  # [1, T-1, H] f[t]
    target: torch.Tensor    # [1, T-1, H] f[t+1]
    mask: torch.Tensor      # [1, T-1] bool: x[t+2] is an assistant token


@dataclass
class LossParts:
    loss: torch.Tensor          # scalar, differentiable
    feature_loss: torch.Tensor  # scalar, detached
    token_loss: torch.Tensor    # scalar, detached
    correct: int                # masked positions where argmax q == argmax p (depth-1 top-1)
    positions: int              # masked positions


def head_inputs(input_ids: torch.Tensor, loss_mask: torch.Tensor, features: torch.Tensor, embed_tokens,
                dtype: torch.dtype, device) -> HeadInputs:
    """One captured sequence (ids [T], mask [T], f [T, H]) -> the head's shifted inputs and targets."""
    ids = input_ids.to(device)
    f = features.to(device=device, dtype=dtype)
    mask = torch.zeros_like(loss_mask, dtype=torch.bool)
    mask[:-2] = loss_mask[2:]
    with torch.no_grad():
        embeds = embed_tokens(ids[1:]).to(dtype)
    return HeadInputs(embeds[None], f[None, :-1], f[None, 1:], mask[None, :-1].to(device))


def _logits(lm_head, x: torch.Tensor) -> torch.Tensor:
    return lm_head(x.to(lm_head.weight.dtype)).float()


def eagle_loss(predicted: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, lm_head,
               feature_weight: float = 1.0, token_weight: float = 0.1) -> LossParts:
    """predicted, target [B, T, H]; mask [B, T] bool. Only masked positions go through the LM head."""
    pred, tgt = predicted[mask], target[mask]  # [N, H]
    n = pred.shape[0]
    if n == 0:
        zero = predicted.sum() * 0.0
        return LossParts(zero, zero.detach(), zero.detach(), 0, 0)
    feature_loss = F.smooth_l1_loss(pred.float(), tgt.float(), reduction="none").mean(-1).mean()
    with torch.no_grad():
        target_logits = _logits(lm_head, tgt)  # [N, V]
        p = target_logits.softmax(-1)
    draft_logits = _logits(lm_head, pred)      # [N, V]
    token_loss = -(p * draft_logits.log_softmax(-1)).sum(-1).mean()
    correct = int((draft_logits.argmax(-1) == target_logits.argmax(-1)).sum())
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
    wanted = _logits(lm_head, inputs.target[mask]).argmax(-1)  # [N]
    features, hits = inputs.features, []
    for _ in range(depths):
        predicted = head(inputs.embeds, features)  # [1, T-1, H]
        hits.append(int((_logits(lm_head, predicted[mask]).argmax(-1) == wanted).sum()))
        features = torch.cat([inputs.features[:, :1], predicted[:, :-1].to(features.dtype)], dim=1)
    return hits
