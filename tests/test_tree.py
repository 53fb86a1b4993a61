import pytest
import torch

from eaglespec.core.tree import (
    EAGLE1_TREE,
    buffers_from_parents,
    chain,
    select_best_nodes,
    static_tree,
)

SMALL = [(0,), (1,), (0, 0), (0, 1), (1, 0)]


def test_chain_buffers_are_literal():
    tree = chain(3)
    assert tree.parents.tolist() == [-1, 0, 1, 2]
    assert tree.buffers.tree_mask.int().tolist() == [
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [1, 1, 1, 0],
        [1, 1, 1, 1],
    ]
    assert tree.buffers.tree_position_ids.tolist() == [0, 1, 2, 3]
    assert tree.buffers.retrieve_indices.tolist() == [[0, 1, 2, 3]]
    assert tree.topk_per_node().tolist() == [1, 1, 1, 0]


def test_small_tree_buffers_are_literal():
    tree = static_tree(SMALL)
    # nodes: 0 root, 1 (0,), 2 (1,), 3 (0,0), 4 (0,1), 5 (1,0)
    assert tree.parents.tolist() == [-1, 0, 0, 1, 1, 2]
    assert tree.ranks.tolist() == [0, 0, 1, 0, 1, 0]
    assert tree.buffers.tree_mask.int().tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],
        [1, 1, 0, 1, 0, 0],
        [1, 1, 0, 0, 1, 0],
        [1, 0, 1, 0, 0, 1],
    ]
    assert tree.buffers.tree_position_ids.tolist() == [0, 1, 1, 2, 2, 2]
    assert tree.buffers.retrieve_indices.tolist() == [[0, 1, 3], [0, 1, 4], [0, 2, 5]]
    assert tree.topk_per_node().tolist() == [2, 2, 1, 0, 0, 0]
    assert tree.level(2).tolist() == [3, 4, 5]


def test_retrieve_indices_pad_short_paths_and_follow_leaf_order():
    buffers = static_tree([(0,), (1,), (0, 0)]).buffers
    # leaf 2 = (1,) is shallower than leaf 3 = (0, 0)
    assert buffers.retrieve_indices.tolist() == [[0, 2, -1], [0, 1, 3]]


def test_node_order_does_not_depend_on_input_order_and_duplicates_collapse():
    shuffled = static_tree([(1, 0), (0, 1), (1,), (0,), (0, 0), (0,)])
    assert shuffled.paths == ((1, 0), (0, 1), (1,), (0,), (0, 0))
    assert shuffled.parents.tolist() == static_tree(SMALL).parents.tolist()
    assert shuffled.ranks.tolist() == static_tree(SMALL).ranks.tolist()


def test_eagle1_tree_shape():
    tree = static_tree(EAGLE1_TREE)
    assert tree.num_nodes == 26
    assert tree.depth == 5
    assert [tree.level(d).numel() for d in range(6)] == [1, 4, 8, 8, 3, 2]
    assert tree.topk_per_node()[0] == 4
    assert tree.buffers.retrieve_indices.shape == (15, 6)


def test_static_tree_rejects_bad_paths():
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        static_tree([(0,), (0, 1, 0)])
    with pytest.raises(ValueError, match="at least one path"):
        static_tree([])
    with pytest.raises(ValueError, match="non-negative"):
        static_tree([(0,), (-1,)])
    with pytest.raises(ValueError, match="depth"):
        chain(0)


def test_buffers_from_parents_validates_order():
    with pytest.raises(ValueError, match="topologically"):
        buffers_from_parents(torch.tensor([-1, 2, 0]))
    with pytest.raises(ValueError, match="topologically"):
        buffers_from_parents(torch.tensor([-1, 0, 2]))
    with pytest.raises(ValueError, match="root"):
        buffers_from_parents(torch.tensor([0, 0]))


def test_buffers_from_parents_of_a_lone_root():
    buffers = buffers_from_parents(torch.tensor([-1]))
    assert buffers.retrieve_indices.tolist() == [[0]]
    assert buffers.tree_mask.tolist() == [[True]]


def _closed(kept: torch.Tensor, parents: torch.Tensor) -> bool:
    kept_set = set(kept.tolist())
    return all(parents[i] < 0 or int(parents[i]) in kept_set for i in kept_set)


def test_select_best_nodes_keeps_the_best_closed_set():
    parents = torch.tensor([-1, -1, 0, 0, 2, 1])
    scores = torch.tensor([-0.1, -1.0, -0.5, -2.0, -0.6, -1.2])
    assert select_best_nodes(scores, parents, 3).tolist() == [0, 2, 4]
    assert select_best_nodes(scores, parents, 4).tolist() == [0, 1, 2, 4]
    assert select_best_nodes(scores, parents, 10).tolist() == [0, 1, 2, 3, 4, 5]


def test_select_best_nodes_breaks_ties_towards_lower_index():
    # A child whose draft probability rounds to 1 ties with its parent; three-way tie here.
    parents = torch.tensor([-1, -1, 1, 0])
    scores = torch.tensor([-0.3, -0.3, -0.3, -0.9])
    assert select_best_nodes(scores, parents, 2).tolist() == [0, 1]
    parents = torch.tensor([-1, 0, -1])
    scores = torch.tensor([-0.3, -0.3, -0.3])
    assert select_best_nodes(scores, parents, 2).tolist() == [0, 1]


def test_select_best_nodes_stays_closed_when_a_child_outscores_its_parent():
    parents = torch.tensor([-1, -1, 0])
    scores = torch.tensor([-1.0, -0.5, -0.1])  # node 2 beats its parent: malformed input
    for total in range(1, 4):
        kept = select_best_nodes(scores, parents, total)
        assert kept.numel() == total
        assert _closed(kept, parents)
    assert select_best_nodes(scores, parents, 1).tolist() == [1]


def test_select_best_nodes_matches_a_plain_reference_on_random_trees():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        m = 40
        parents = [-1] + [int(torch.randint(-1, i, (), generator=g)) for i in range(1, m)]
        parents = torch.tensor(parents)
        logp = torch.log(torch.rand(m, generator=g))
        scores = logp.clone()
        for i in range(m):  # cumulative log-prob along the path
            if parents[i] >= 0:
                scores[i] += scores[parents[i]]
        for total in (1, 7, 25):
            kept = select_best_nodes(scores, parents, total)
            reference = sorted(range(m), key=lambda i: (-float(scores[i]), i))[:total]
            assert kept.tolist() == sorted(reference)
            assert _closed(kept, parents)


def test_leaf_flags_nodes_without_children():
    gen = torch.Generator().manual_seed(0)
    for n in (1, 2, 7, 26, 60):
        parents = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)])
        b = buffers_from_parents(parents)
        assert b.leaf == tuple(not bool((parents == i).any()) for i in range(n))
        assert sum(b.leaf) == b.retrieve_indices.shape[0]  # one candidate path per leaf


def test_select_best_nodes_puts_nan_scores_last_and_stays_closed():
    """A NaN score (a broken draft) counts as -inf: its node and its subtree go last, and what is
    kept is still closed under parents."""
    parents = torch.tensor([-1, 0, -1, 2])
    scores = torch.tensor([-0.2, float("nan"), -0.5, -0.7])
    assert select_best_nodes(scores, parents, 3).tolist() == [0, 2, 3]
    kept = select_best_nodes(scores, parents, 2)
    assert kept.tolist() == [0, 2] and _closed(kept, parents)
