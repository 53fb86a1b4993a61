import math

import pytest
import torch

from eaglespec.core.sampling import logits_to_probs
from eaglespec.core.tree import chain, static_tree
from eaglespec.core.verify import Acceptance, greedy_ids, verify_greedy, verify_sampling

V = 8


def logits_with_argmax(argmax: list[int], vocab: int = V) -> torch.Tensor:
    logits = torch.zeros(len(argmax), vocab)  # [N, V]
    logits[torch.arange(len(argmax)), torch.tensor(argmax)] = 1.0
    return logits


# ---- greedy ---------------------------------------------------------------------------------

CHAIN = chain(3).buffers.retrieve_indices  # [[0, 1, 2, 3]]
CHAIN_TOKENS = torch.tensor([5, 1, 2, 3])


def test_greedy_accepts_all_and_adds_the_bonus_token():
    result = verify_greedy(CHAIN_TOKENS, logits_with_argmax([1, 2, 3, 4]), CHAIN)
    assert result.path.tolist() == [0, 1, 2, 3]
    assert result.accepted_tokens.tolist() == [1, 2, 3]
    assert result.num_accepted == 3
    assert result.next_token == 4


def test_greedy_rejects_the_first_token():
    result = verify_greedy(CHAIN_TOKENS, logits_with_argmax([0, 2, 3, 4]), CHAIN)
    assert result.path.tolist() == [0]
    assert result.accepted_tokens.tolist() == []
    assert result.next_token == 0


def test_greedy_partial_acceptance():
    result = verify_greedy(CHAIN_TOKENS, logits_with_argmax([1, 6, 3, 4]), CHAIN)
    assert result.path.tolist() == [0, 1]
    assert result.accepted_tokens.tolist() == [1]
    assert result.next_token == 6


def test_greedy_picks_the_longest_branch_and_the_first_among_ties():
    tree = static_tree([(0,), (1,), (0, 0), (0, 1), (1, 0)])
    retrieve = tree.buffers.retrieve_indices  # [[0, 1, 3], [0, 1, 4], [0, 2, 5]]
    tokens = torch.tensor([7, 1, 2, 3, 4, 5])
    best_is_last = verify_greedy(tokens, logits_with_argmax([2, 0, 5, 0, 0, 6]), retrieve)
    assert best_is_last.path.tolist() == [0, 2, 5]
    assert best_is_last.accepted_tokens.tolist() == [2, 5]
    assert best_is_last.next_token == 6
    tie = verify_greedy(tokens, logits_with_argmax([1, 0, 0, 0, 0, 0]), retrieve)
    assert tie.path.tolist() == [0, 1]
    assert tie.next_token == 0
    # the same walk over the buffers' host copy of the rows (what decoding passes)
    assert tree.buffers.paths == tuple(map(tuple, retrieve.tolist()))
    for argmax in ([2, 0, 5, 0, 0, 6], [1, 0, 0, 0, 0, 0], [1, 3, 0, 0, 0, 0]):
        a, b = (verify_greedy(tokens, logits_with_argmax(argmax), r) for r in (retrieve, tree.buffers.paths))
        assert (a.path.tolist(), a.accepted_tokens.tolist(), a.next_token) == \
            (b.path.tolist(), b.accepted_tokens.tolist(), b.next_token)


def test_greedy_ids_pick_as_argmax_does_the_first_among_ties():
    """Decoding's greedy choice (max, faster than argmax on a CPU) is argmax's, ties included:
    the first index of a row's largest logit, wherever the tied copies sit in a SmolLM2-sized row
    (inside one vector, across vectors, at the row's ends)."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 49152, generator=g)
    for row, places in enumerate([(0, 1), (3, 40000), (17, 49151), (49150, 49151), (8, 24, 4096), (100,)]):
        logits[row, list(places)] = 50.0
    assert greedy_ids(logits).tolist() == logits.argmax(-1).tolist() == [0, 3, 17, 49150, 8, 100]
    assert greedy_ids(logits[2]).item() == 17 and greedy_ids(logits[None]).shape == (1, 6)
    assert greedy_ids(torch.zeros(3, 5)).tolist() == [0, 0, 0]
    # bf16 rounding makes many ties; NaN (first one) and infinities as argmax has them
    odd = torch.tensor([[1.0, math.nan, 2.0, math.nan], [-math.inf] * 4, [0.0, math.inf, 1.0, math.inf], [-0.0, 0.0, -1.0, 0.0]])
    for x in (logits.bfloat16(), odd, odd.bfloat16()):
        assert greedy_ids(x).tolist() == x.argmax(-1).tolist()
    assert greedy_ids(odd).tolist() == [1, 0, 1, 0]


def test_greedy_padding_never_matches():
    retrieve = static_tree([(0,), (1,), (0, 0)]).buffers.retrieve_indices  # [[0, 2, -1], [0, 1, 3]]
    tokens = torch.tensor([7, 1, 2, 3])
    # Node 2 predicts 7, the root's token, which a clamped -1 would read.
    result = verify_greedy(tokens, logits_with_argmax([2, 0, 7, 0]), retrieve)
    assert result.path.tolist() == [0, 2]
    assert result.next_token == 7


# ---- sampling: exact cases ------------------------------------------------------------------


def test_sampling_certain_drafts_are_accepted_and_the_bonus_comes_from_the_leaf():
    probs = torch.zeros(4, V)
    probs[0, 1] = probs[1, 2] = probs[2, 3] = probs[3, 4] = 1.0
    for seed in range(5):
        g = torch.Generator().manual_seed(seed)
        result = verify_sampling(CHAIN_TOKENS, probs, chain(3).parents, g)
        assert result.path.tolist() == [0, 1, 2, 3]
        assert result.next_token == 4


def test_sampling_impossible_drafts_are_rejected_and_the_recovered_token_avoids_them():
    tree = static_tree([(0,), (1,)])
    tokens = torch.tensor([0, 1, 2])
    probs = torch.full((3, V), 1.0 / (V - 2))
    probs[0, 1:3] = 0.0
    g = torch.Generator().manual_seed(0)
    results = [verify_sampling(tokens, probs, tree.parents, g) for _ in range(200)]
    assert all(r.path.tolist() == [0] for r in results)
    assert {r.next_token for r in results} == {0, 3, 4, 5, 6, 7}


def test_sampling_residual_drops_a_rejected_sibling():
    # p = 1/2 on each of two drafted siblings: once the first is rejected the residual is a point
    # mass on the second, so some draft token is always accepted.
    tree = static_tree([(0,), (1,)])
    tokens = torch.tensor([0, 3, 5])
    probs = torch.full((3, V), 1.0 / V)
    probs[0] = 0.0
    probs[0, 3] = probs[0, 5] = 0.5
    g = torch.Generator().manual_seed(0)
    results = [verify_sampling(tokens, probs, tree.parents, g) for _ in range(200)]
    assert all(r.num_accepted == 1 for r in results)
    assert {int(r.path[1]) for r in results} == {1, 2}


# ---- sampling: statistical losslessness -----------------------------------------------------

Z = 3.719  # normal quantile for alpha = 1e-4: some 30 checks run, so false alarms are rare


def chi_square_fits(counts: torch.Tensor, probs: torch.Tensor) -> tuple[bool, float, float]:
    """Pearson goodness of fit of counts [V] to probs [V]; critical value by Wilson-Hilferty."""
    counts, probs = counts.double(), probs.double()
    if counts[probs == 0].sum() > 0:
        return False, math.inf, 0.0
    expected = probs * counts.sum()
    order = expected.argsort()
    expected, counts = expected[order], counts[order]
    # The chi-square approximation wants >= 5 expected per cell: pool the rarest cells.
    k = int((expected.cumsum(0) < 5).sum())
    expected = torch.cat([expected[: k + 1].sum(0, keepdim=True), expected[k + 1 :]])
    counts = torch.cat([counts[: k + 1].sum(0, keepdim=True), counts[k + 1 :]])
    df = expected.numel() - 1
    if df == 0:
        return True, 0.0, 0.0
    stat = float(((counts - expected) ** 2 / expected).sum())
    critical = df * (1 - 2 / (9 * df) + Z * math.sqrt(2 / (9 * df))) ** 3
    return stat <= critical, stat, critical


def emission_checks(verify, tokens, probs, parents, runs: int, seed: int) -> list[tuple]:
    """Run `verify` many times; test the first emitted token against p at the root, and the
    second against p at the drafted child that the first one came from."""
    g = torch.Generator().manual_seed(seed)
    root_children = (parents == 0).nonzero().flatten().tolist()
    first = torch.zeros(V)
    second = {child: torch.zeros(V) for child in root_children}
    for _ in range(runs):
        result = verify(tokens, probs, parents, g)
        emitted = result.accepted_tokens.tolist() + [result.next_token]
        first[emitted[0]] += 1
        if result.num_accepted >= 1:
            second[int(result.path[1])][emitted[1]] += 1
    checks = [("first token", *chi_square_fits(first, probs[0]))]
    for child, counts in second.items():
        if counts.sum() >= 300:
            name = f"second token after node {child}"
            checks.append((name, *chi_square_fits(counts, probs[child])))
    return checks


TREES = {
    # parents, and the rank under the parent's p of each node's token: likely, middling, unlikely
    "chain": ([-1, 0, 1, 2], [0, 0, 3, 0]),
    "tree": ([-1, 0, 0, 0, 1, 1, 2], [0, 0, 2, V - 1, 1, 0, V - 1]),
}
SETTINGS = [(1.0, 0, 1.0), (0.7, 0, 0.9), (1.5, 5, 1.0)]  # temperature, top_k, top_p


def synthetic_case(tree: str, temperature: float, top_k: int, top_p: float, seed: int = 1):
    parents, ranks = TREES[tree]
    parents = torch.tensor(parents)
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(parents.numel(), V, generator=g, dtype=torch.float64)  # [N, V]
    probs = logits_to_probs(logits, temperature, top_k, top_p)
    tokens = [0]
    for node in range(1, parents.numel()):
        by_rank = probs[parents[node]].argsort(descending=True, stable=True)
        tokens.append(int(by_rank[ranks[node]]))
    return torch.tensor(tokens), probs, parents, logits


def describe(checks) -> str:
    return "; ".join(f"{name}: chi2 {stat:.1f} vs {crit:.1f}" for name, _, stat, crit in checks)


@pytest.mark.parametrize("tree", TREES)
@pytest.mark.parametrize("setting", SETTINGS)
def test_sampling_emits_the_target_distribution(tree, setting):
    tokens, probs, parents, _ = synthetic_case(tree, *setting)
    checks = emission_checks(verify_sampling, tokens, probs, parents, runs=6000, seed=1)
    assert len(checks) >= 2, "too few samples reached a drafted child to test the second token"
    assert all(ok for _, ok, _, _ in checks), describe(checks)


def flawed_verify(accept_prob, residual):
    """The same tree walk as verify_sampling with one of its two steps swapped for a wrong one."""

    def verify(tree_tokens, target_probs, parents, generator):
        children = [[] for _ in range(tree_tokens.numel())]
        for child, parent in enumerate(parents.tolist()[1:], start=1):
            children[parent].append(child)
        path, node = [0], 0
        while True:
            p = target_probs[node].clone()
            accepted = None
            for child in children[node]:
                token = int(tree_tokens[child])
                u = torch.rand((), generator=generator, dtype=p.dtype)
                if u < accept_prob(p, node, token):
                    accepted = child
                    break
                p = residual(p, node, token)
            if accepted is None:
                path = torch.tensor(path)
                next_token = int(torch.multinomial(p, 1, generator=generator))
                return Acceptance(path, tree_tokens[path[1:]], next_token)
            node = accepted
            path.append(node)

    return verify


def test_the_check_catches_wrong_acceptance_rules():
    tokens, probs, parents, logits = synthetic_case("tree", 1.0, 0, 1.0)
    # The draft's own distribution q: what a sampled (not top-k) draft would have proposed from.
    g = torch.Generator().manual_seed(2)
    q = logits_to_probs(logits + torch.randn(logits.shape, generator=g, dtype=logits.dtype), 1.0)

    def minus_q(p, node, token):
        left = (p - q[node]).clamp(min=0)
        return left / left.sum() if left.sum() > 0 else p

    wrong_rules = {
        "rejected token left in the residual": flawed_verify(
            lambda p, node, t: p[t], lambda p, node, t: p
        ),
        "p / q acceptance for top-k children": flawed_verify(
            lambda p, node, t: p[t] / q[node, t], minus_q
        ),
    }
    for name, verify in wrong_rules.items():
        checks = emission_checks(verify, tokens, probs, parents, runs=6000, seed=1)
        assert not all(ok for _, ok, _, _ in checks), f"{name} passed: {describe(checks)}"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_sibling_is_accepted_exactly_when_a_float64_draw_falls_below_its_p(seed):
    """The acceptance draw is float64 against float32 probabilities: with p[c] the float32 just
    above the seeded draw the child is accepted, just below it rejected (a float32 draw, on a
    2^-24 grid, accepted a child of p < 2^-24 with probability 2^-24, not p)."""
    u = float(torch.rand((), generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    nearest = torch.tensor(u, dtype=torch.float32)
    above = nearest if float(nearest) > u else torch.nextafter(nearest, torch.tensor(2.0))  # the least float32 > u
    below = torch.nextafter(above, torch.tensor(-1.0))
    assert float(below) < u < float(above)
    for pc, accepted in ((above, True), (below, False)):
        p = torch.zeros(2, 4)
        p[0, 1], p[0, 2] = pc, 1 - pc
        p[1, 3] = 1.0
        result = verify_sampling(torch.tensor([0, 1]), p, torch.tensor([-1, 0]), torch.Generator().manual_seed(seed))
        assert (result.path.tolist() == [0, 1]) is accepted
