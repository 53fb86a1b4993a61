import math

import pytest
import torch

from eaglespec.core.sampling import NUCLEUS_CANDIDATES, _nucleus, _nucleus_from_candidates, logits_to_probs, sample


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


def reference_nucleus(probs, top_p):
    """The definition, one token at a time: rank by (probability desc, id asc); keep a token while
    the mass ranked above it is below top_p; the best token always stays."""
    keep = torch.zeros_like(probs, dtype=torch.bool)
    for row, p in zip(keep.view(-1, probs.shape[-1]), probs.view(-1, probs.shape[-1]).tolist()):
        above = 0.0
        for rank, token in enumerate(sorted(range(len(p)), key=lambda i: (-p[i], i))):
            if rank > 0 and above >= top_p:
                break
            row[token] = True
            above += p[token]
    return keep


def peaked(rows, vocab, scale, seed=0):
    return (torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale).softmax(-1)


@pytest.mark.parametrize("top_p", [0.1, 0.5, 0.9, 0.99])
def test_top_p_from_candidates_equals_the_definition(top_p):
    probs = peaked(3, 3000, 8.0)  # an LM-like peak: 256 candidates hold nearly all the mass
    assert _nucleus_from_candidates(probs, top_p, NUCLEUS_CANDIDATES) is not None
    assert torch.equal(_nucleus(probs, top_p), reference_nucleus(probs, top_p))


@pytest.mark.parametrize("top_p", [0.5, 0.99])
def test_top_p_falls_back_to_the_full_sort_when_candidates_cannot_decide(top_p):
    probs = peaked(2, 3000, 1.0)  # flat: 256 candidates hold ~30% of the mass
    assert _nucleus_from_candidates(probs, top_p, NUCLEUS_CANDIDATES) is None
    assert torch.equal(_nucleus(probs, top_p), reference_nucleus(probs, top_p))


def test_top_p_after_top_k_is_decided_by_the_candidates():
    logits = torch.randn(2, 3000, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    probs = logits_to_probs(logits, 1.0, top_k=50)  # zeros beyond the 50 best: t = 0
    assert _nucleus_from_candidates(probs, 0.9, NUCLEUS_CANDIDATES) is not None
    assert torch.equal(_nucleus(probs, 0.9), reference_nucleus(probs, 0.9))


@pytest.mark.parametrize("tie_at", ["inside", "across the edge"])
def test_top_p_ties_rank_lower_ids_first(tie_at):
    vocab = 1000
    perm = torch.randperm(vocab, generator=torch.Generator().manual_seed(0))  # tied tokens at scattered ids
    logits = torch.zeros(vocab, dtype=torch.float64)
    if tie_at == "inside":  # 1 leader, then 40 equal tokens that the nucleus cuts through
        logits[perm[0]], logits[perm[1:41]] = 9.0, 6.0
    else:  # 600 equal tokens straddle the 256 candidates' edge
        logits[perm[:600]] = 9.0
    probs = logits.softmax(-1)
    keep = _nucleus(probs, 0.5)
    assert torch.equal(keep, reference_nucleus(probs, 0.5))
    tied = perm[1:41] if tie_at == "inside" else perm[:600]
    kept = sorted(int(t) for t in tied if keep[t])
    assert 0 < len(kept) < len(tied) and kept == sorted(int(t) for t in tied)[:len(kept)]  # the lowest ids
    assert (_nucleus_from_candidates(probs, 0.5, NUCLEUS_CANDIDATES) is None) == (tie_at != "inside")


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
