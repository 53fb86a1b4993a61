"""The training loss against a plain reference, the input alignment, and the depth roll-out."""

import torch
import torch.nn.functional as F
from test_train_capture import one_thread  # noqa: F401 (autouse fixture)

from eaglespec.train.loss import HeadInputs, eagle_loss, head_inputs, rollout_correct

H, V = 8, 11


def reference_loss(predicted, target, mask, lm_head, w_f, w_p):
    """The official EAGLE code's formula, position by position: sums weighted by the mask, divided by its sum."""
    feature, token, n = 0.0, 0.0, 0
    for b in range(predicted.shape[0]):
        for t in range(predicted.shape[1]):
            if not mask[b, t]:
                continue
            n += 1
            feature = feature + F.smooth_l1_loss(predicted[b, t], target[b, t])
            p = torch.softmax(lm_head(target[b, t]), -1)
            log_q = torch.log_softmax(lm_head(predicted[b, t]), -1)
            token = token - (p * log_q).sum()
    return w_f * feature / n + w_p * token / n


def test_loss_equals_the_reference_and_so_do_its_gradients():
    """A batch's loss is the sum over its sequences of each one's reference loss (the trainer
    divides by the step's sequence count), so that a micro-batch takes the step one sequence at
    a time would; a sequence with no masked position adds nothing."""
    g = torch.Generator().manual_seed(0)
    lm_head = torch.nn.Linear(H, V, bias=False).double()
    predicted = torch.randn(3, 6, H, generator=g, dtype=torch.float64, requires_grad=True)
    target = torch.randn(3, 6, H, generator=g, dtype=torch.float64)
    mask = torch.rand(3, 6, generator=g) > 0.4
    mask[1] = False
    assert mask[0].any() and mask[2].any() and mask[0].sum() != mask[2].sum()
    parts = eagle_loss(predicted, target, mask, lm_head, feature_weight=1.0, token_weight=0.1)
    reference = sum(reference_loss(predicted[b:b + 1], target[b:b + 1], mask[b:b + 1], lm_head, 1.0, 0.1)
                    for b in (0, 2))
    torch.testing.assert_close(parts.loss, reference.float(), rtol=1e-6, atol=1e-6)
    assert parts.positions == int(mask.sum())
    (grad,) = torch.autograd.grad(parts.loss, predicted)
    (grad_ref,) = torch.autograd.grad(reference, predicted)
    torch.testing.assert_close(grad.double(), grad_ref, rtol=1e-5, atol=1e-7)


def test_loss_without_masked_positions_is_zero_with_a_gradient():
    predicted = torch.randn(1, 3, H, requires_grad=True)
    parts = eagle_loss(predicted, torch.randn(1, 3, H), torch.zeros(1, 3, dtype=torch.bool), torch.nn.Linear(H, V))
    parts.loss.backward()
    assert parts.loss.item() == 0.0 and parts.positions == 0 and predicted.grad is not None


def test_head_inputs_alignment():
    """Position t: (embed(x[t+1]), f[t]) -> f[t+1], counted when x[t+2] is an assistant token."""
    ids = torch.tensor([5, 6, 7, 8, 9])
    loss_mask = torch.tensor([0, 0, 0, 1, 1], dtype=torch.bool)
    f = torch.arange(5.0)[:, None].expand(5, H)
    embed = torch.nn.Embedding(10, H)
    with torch.no_grad():
        embed.weight.copy_(torch.arange(10.0)[:, None].expand(10, H))
    inputs = head_inputs(ids, loss_mask, f, embed, torch.float32, "cpu")
    assert inputs.embeds[0, :, 0].tolist() == [6, 7, 8, 9]
    assert inputs.features[0, :, 0].tolist() == [0, 1, 2, 3]
    assert inputs.target[0, :, 0].tolist() == [1, 2, 3, 4]
    assert inputs.mask[0].tolist() == [False, True, True, False]


def test_rollout_feeds_the_heads_own_features_back():
    """With a 'head' that returns its input feature, the depth-k prediction at t is f[t-k+1]."""
    g = torch.Generator().manual_seed(1)
    t = 9
    f = torch.randn(1, t + 1, H, generator=g)
    mask = torch.ones(1, t, dtype=torch.bool)
    mask[0, :3] = False
    inputs = HeadInputs(torch.zeros(1, t, H), f[:, :-1], f[:, 1:], mask)
    lm_head = torch.nn.Linear(H, V)
    hits = rollout_correct(lambda embeds, features: features, inputs, lm_head, depths=4)
    tokens = lm_head(f[0]).argmax(-1)  # token of f[s], s = 0..t
    expected = [sum(int(tokens[max(s - k + 1, 0)] == tokens[s + 1]) for s in range(3, t)) for k in range(1, 5)]
    assert hits == expected
