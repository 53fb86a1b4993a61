"""Draft trees as data, and the tensors one verification step needs (PURE).

EAGLE (Li et al., ICML 2024) verifies a whole tree of draft tokens in one target forward; EAGLE-2
(EMNLP 2024) grows that tree dynamically and keeps the nodes with the highest cumulative draft
log-probability (the product of the draft probabilities q along the path). Node 0 is always the
root: the token the target already chose, whose children are the first draft tokens.

Tree-buffer vocabulary (as in Medusa / EAGLE):
    tree_mask          [N, N] bool, node i attends to itself and its ancestors
    tree_position_ids  [N] depth of each node, added to the current sequence length
    retrieve_indices   [L, D+1] the root-to-leaf node indices of each candidate path, -1 padded
"""

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TreeBuffers:
    parents: torch.Tensor  # [N] long, parent node index, -1 for the root; parents[i] < i
    tree_mask: torch.Tensor  # [N, N] bool, tree_mask[i, j] = j is i or an ancestor of i
    tree_position_ids: torch.Tensor  # [N] long, depth of each node (root = 0)
    retrieve_indices: torch.Tensor  # [L, D+1] long, root-to-leaf paths by leaf index, -1 padded
    leaf: tuple[bool, ...]  # leaf[i]: node i has no children (read per step on the host: a tuple)
    paths: tuple[tuple[int, ...], ...]  # retrieve_indices' rows on the host (walked per greedy step)


def _check_parents(parents: torch.Tensor) -> None:
    if parents.dim() != 1 or parents.numel() == 0:
        shape = tuple(parents.shape)
        raise ValueError(f"parents must be a non-empty 1-D tensor, got shape {shape}")
    if int(parents[0]) != -1:
        raise ValueError(f"parents[0] must be -1 (node 0 is the root), got {int(parents[0])}")
    index = torch.arange(parents.numel(), device=parents.device)
    bad = ((parents < 0) | (parents >= index))[1:].nonzero()
    if bad.numel():
        i = int(bad[0]) + 1
        raise ValueError(
            f"parents must be topologically ordered (0 <= parents[i] < i for i > 0), "
            f"got parents[{i}] = {int(parents[i])}"
        )


def buffers_from_parents(parents: torch.Tensor) -> TreeBuffers:
    """Turn a parent array into the attention mask, positions and candidate paths of the tree."""
    _check_parents(parents)
    parents = parents.long()
    n = parents.numel()
    rows = torch.arange(n, device=parents.device)
    # The root is made its own parent so that walking up saturates there; each pass of the loop
    # moves every node one level up at once, so the loop runs D times, not N times.
    up = parents.clone()
    up[0] = 0
    tree_mask = torch.eye(n, dtype=torch.bool, device=parents.device)
    depth = torch.zeros(n, dtype=torch.long, device=parents.device)
    node = rows
    while bool((node != 0).any()):
        depth += node != 0
        node = up[node]
        tree_mask[rows, node] = True

    is_leaf = torch.ones(n, dtype=torch.bool, device=parents.device)
    is_leaf[parents[1:]] = False
    leaves = is_leaf.nonzero().flatten()  # [L]
    # Ancestors have smaller indices than their descendants, so each ancestor lands in the
    # column given by its depth.
    leaf_row, ancestor = tree_mask[leaves].nonzero(as_tuple=True)
    retrieve = torch.full(
        (leaves.numel(), int(depth.max()) + 1), -1, dtype=torch.long, device=parents.device
    )
    retrieve[leaf_row, depth[ancestor]] = ancestor
    paths = tuple(map(tuple, retrieve.tolist()))
    return TreeBuffers(parents, tree_mask, depth, retrieve, tuple(is_leaf.tolist()), paths)


@dataclass(frozen=True)
class StaticTree:
    """A tree given as data: EAGLE-1/Medusa 'choices'. Each path is a tuple of ranks: (0, 1) = the
    second-best child of the best child of the root."""

    paths: tuple[tuple[int, ...], ...]  # as given (deduplicated), excluding the root
    parents: torch.Tensor  # [N] long, N = len(paths) + 1; nodes sorted by (depth, path)
    ranks: torch.Tensor  # [N] long, rank among the parent's children (root: 0)
    depths: torch.Tensor  # [N] long
    buffers: TreeBuffers

    @property
    def depth(self) -> int:
        return int(self.depths.max())

    @property
    def num_nodes(self) -> int:
        return self.parents.numel()

    def topk_per_node(self) -> torch.Tensor:
        """[N] long: how many top-ranked draft tokens each node must propose (0 for leaves)."""
        k = torch.zeros(self.num_nodes, dtype=torch.long)
        return k.scatter_reduce(0, self.parents[1:], self.ranks[1:] + 1, reduce="amax")

    def level(self, d: int) -> torch.Tensor:
        return (self.depths == d).nonzero().flatten()


def static_tree(paths) -> StaticTree:
    """Validate a list of rank paths and lay the tree out so that siblings are in rank order."""
    given = tuple(dict.fromkeys(tuple(path) for path in paths))
    if not given:
        raise ValueError("a static tree needs at least one path, e.g. [(0,)]")
    for path in given:
        if not path:
            raise ValueError("paths exclude the root: an empty path () is not allowed")
        if not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in path):
            raise ValueError(f"path {path} must hold non-negative int ranks")
    known = set(given)
    for path in given:
        if len(path) > 1 and path[:-1] not in known:
            raise ValueError(f"path {path} needs its prefix {path[:-1]} in the tree too")

    ordered = sorted(given, key=lambda path: (len(path), path))
    node_of = {path: i + 1 for i, path in enumerate(ordered)}
    node_of[()] = 0
    parents = torch.tensor([-1] + [node_of[path[:-1]] for path in ordered], dtype=torch.long)
    ranks = torch.tensor([0] + [path[-1] for path in ordered], dtype=torch.long)
    depths = torch.tensor([0] + [len(path) for path in ordered], dtype=torch.long)
    return StaticTree(given, parents, ranks, depths, buffers_from_parents(parents))


def chain(depth: int) -> StaticTree:
    """The plain speculative-decoding chain: one draft token per level."""
    if depth < 1:
        raise ValueError(f"chain depth must be >= 1, got {depth}")
    return static_tree([(0,) * d for d in range(1, depth + 1)])


# EAGLE-1's default tree (mc_sim_7b_63 in the official choices.py): 4/8/8/3/2 nodes per level.
EAGLE1_TREE: tuple[tuple[int, ...], ...] = (
    (0,), (1,), (2,), (3,),
    (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0),
    (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (0, 2, 0), (0, 2, 1), (1, 0, 0),
    (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2),
    (0, 0, 0, 0, 0), (0, 0, 0, 0, 1),
)  # fmt: skip


def select_best_nodes(scores: torch.Tensor, parents: torch.Tensor, total: int) -> torch.Tensor:
    """EAGLE-2 reranking: keep the `total` candidates with the highest cumulative log-probability.

    scores: [M] cumulative draft log-probability; parents: [M] index of each candidate's parent
    among the candidates, -1 under the root; parents[i] < i. Returns [min(total, M)] ascending.
    """
    kept = best_nodes(scores.tolist(), parents.tolist(), total)
    return torch.tensor(kept, dtype=torch.long, device=scores.device)


def best_nodes(scores: list[float], parents: list[int], total: int) -> list[int]:
    """`select_best_nodes` on Python lists (a drafter's few dozen candidates: a tensor op per
    candidate level costs more than the whole selection in plain Python)."""
    m = len(scores)
    if total >= m:
        return list(range(m))
    # A child's cumulative log-prob never exceeds its parent's, so with ties broken towards the
    # lower (parent) index the best `total` are closed under parents. Scores that break that (a
    # caller's bug) are first capped by their parent's capped score, and NaN counts as -inf: this
    # changes nothing for well-formed input and keeps the kept set a tree.
    capped: list[float] = []
    for s, p in zip(scores, parents):
        s = -math.inf if s != s else s
        capped.append(s if p < 0 else min(s, capped[p]))
    order = sorted(range(m), key=lambda i: -capped[i])  # stable: ties keep the lower index first
    return sorted(order[:total])
