import math

import pytest
import torch

from eaglespec.sampling import _nucleus, logits_to_probs, sample


def close(actual: torch.Tensor, expected: list[float]) -> bool:
    return torch.allclose(actual, torch.tensor(expected, dtype=actual.dtype), atol=1e-6)


def test_temperature_scales_logits():
    logits = torch.tensor([0.0, math.log(2), math.log(4)])
    assert close(logits_to_probs(logits, 1.0), [1 / 7, 2 / 7, 4 / 7])
    assert close(logits_to_probs(logits, 0.5), [1 / 21, 4 / 21, 16 / 21])


def test_top_k_keeps_the_k_best_and_ties_at_the_kth():
    logits = torch.tensor([1.0, 3.0, 2.0, 0.0])
    e = math.e
    assert close(logits_to_probs(logits, 1.0, top_k=2), [0, e / (e + 1), 1 / (e + 1), 0])
    assert close(logits_to_probs(torch.tensor([1.0, 1.0, 0.0]), 1.0, top_k=1), [0.5, 0.5, 0])
    assert close(logits_to_probs(logits, 1.0, top_k=10), logits.softmax(-1).tolist())


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = [0.15, 0.5, 0.05, 0.3]  # ranked 0.5, 0.3, 0.15, 0.05
    logits = torch.tensor(probs).log()
    assert close(logits_to_probs(logits, 1.0, top_p=0.7), [0, 0.625, 0, 0.375])
    assert close(logits_to_probs(logits, 1.0, top_p=0.4), [0, 1, 0, 0])
    assert close(logits_to_probs(logits, 1.0, top_p=0.85), [0.15 / 0.95, 0.5 / 0.95, 0, 0.3 / 0.95])
    assert close(logits_to_probs(logits, 1.0, top_p=1e-9), [0, 1, 0, 0])  # never empty


def _nucleus_by_full_sort(probs, top_p):
    ranked, order = probs.sort(dim=-1, descending=True, stable=True)
    keep = ranked.cumsum(dim=-1) - ranked < top_p
    keep[..., 0] = True
    return keep.scatter(-1, order, keep)


@pytest.mark.parametrize("temperature", [0.3, 1.0, 5.0])  # peaked: the candidates suffice; flat: full sort
@pytest.mark.parametrize("top_p", [0.1, 0.5, 0.9, 0.99])
def test_top_p_candidates_give_the_full_sort_set(temperature, top_p):
    logits = torch.randn(3, 5000, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 4
    probs = (logits / temperature).softmax(-1)
    assert torch.equal(_nucleus(probs, top_p), _nucleus_by_full_sort(probs, top_p))


def test_top_p_ties_rank_lower_ids_first_across_the_candidates_edge():
    # 600 equal tokens: the nucleus cuts inside the tie, which straddles the 256 candidates' edge
    logits = torch.zeros(1000, dtype=torch.float64)
    logits[:600] = 3.0
    probs = logits.softmax(-1)
    keep = _nucleus(probs, 0.5)
    assert torch.equal(keep, _nucleus_by_full_sort(probs, 0.5))
    kept = keep.nonzero().flatten()
    assert kept.tolist() == list(range(len(kept))) and 0 < len(kept) < 600  # the lowest ids of the tie


def test_temperature_comes_before_top_p():
    logits = torch.tensor([0.5, 0.3, 0.2]).log()
    assert close(logits_to_probs(logits, 1.0, top_p=0.75), [0.625, 0.375, 0])
    # A hot temperature flattens p, so the same top_p has to keep all three tokens.
    hot = logits_to_probs(logits, 1e6, top_p=0.75)
    assert close(hot, [1 / 3, 1 / 3, 1 / 3])


def test_top_k_comes_before_top_p():
    logits = torch.tensor([0.4, 0.3, 0.2, 0.1]).log()
    # After top-k the survivors are 4/7 and 3/7, and 4/7 alone already reaches 0.5.
    assert close(logits_to_probs(logits, 1.0, top_k=2, top_p=0.5), [1, 0, 0, 0])
    assert close(logits_to_probs(logits, 1.0, top_p=0.5), [4 / 7, 3 / 7, 0, 0])


def test_batched_shapes_and_dtypes():
    logits = torch.randn(2, 3, 11, generator=torch.Generator().manual_seed(0))
    probs = logits_to_probs(logits, 0.8, top_k=5, top_p=0.9)
    assert probs.shape == (2, 3, 11)
    assert torch.allclose(probs.sum(-1), torch.ones(2, 3))
    assert ((probs > 0).sum(-1) <= 5).all()
    assert logits_to_probs(logits.half(), 1.0).dtype == torch.float32
    assert logits_to_probs(logits.double(), 1.0).dtype == torch.float64
    with pytest.raises(ValueError, match="temperature"):
        logits_to_probs(logits, 0.0)


def test_sample_shapes_and_seeding():
    probs = torch.zeros(2, 3, 5)
    probs[..., 3] = 1.0
    assert sample(probs).tolist() == [[3, 3, 3], [3, 3, 3]]
    assert sample(probs[0, 0]).shape == ()
    uniform = torch.full((64, 10), 0.1)
    first = sample(uniform, torch.Generator().manual_seed(1))
    again = sample(uniform, torch.Generator().manual_seed(1))
    assert first.tolist() == again.tolist()
    assert first.unique().numel() > 1
