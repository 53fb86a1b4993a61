"""Accept draft tokens from a tree so that the output is exactly the target's (PURE).

Symbols (EAGLE, Li et al., ICML 2024, appendix A.2; SpecInfer's multi-round speculative sampling):
    p    the target's processed distribution at a tree node (temperature / top-k / top-p applied)
    q    the draft's proposal for a child of that node
    tau  average acceptance length: tokens emitted per target forward (accepted + 1)
    accepted token   a draft token the target keeps
    recovered token  sampled from the residual after every child of a node was rejected
    bonus token      the target's own token after the last accepted node

Why sampling is lossless. EAGLE drafts children deterministically (the top-k draft tokens), so
the proposal that produced child c is a point mass: q = delta_c. Rejection sampling with that
proposal accepts c with probability min(1, p(c) / q(c)) = p(c), and on rejection continues from
the residual norm(max(p - q, 0)), which is p with c removed and renormalised, i.e. p conditioned
on "the token is not c". Trying siblings in turn against successive residuals therefore emits
each drafted token with its probability under p, and any other token, from the final residual,
with its probability under p as well. The emitted token has distribution p at every position,
and by induction along the accepted path the whole output is distributed as the target's.

Reproducible sampling (`verify_chosen`) gives up that coupling for a stronger guarantee: the
target's token at every node is fixed in advance by keyed Gumbel noise (core/noise.py), so
verification is greedy verification against those perturbed choices, and the output is the seeded
vanilla sample itself, token for token, whatever the tree. Its acceptance is P(draft's perturbed
choice = target's), which can be below multi-round speculative sampling's 1 - TV(p, q).
"""

from dataclasses import dataclass

from typing import Callable, Sequence

import torch


@dataclass(frozen=True)
class Acceptance:
    path: torch.Tensor  # [a+1] long: tree node indices of the accepted path, root (node 0) first
    accepted_tokens: torch.Tensor  # [a] long: the accepted draft tokens (tokens of path[1:])
    next_token: int  # the bonus token after a fully tried path, else the recovered token

    @property
    def num_accepted(self) -> int:
        return self.accepted_tokens.numel()


def greedy_ids(logits: torch.Tensor) -> torch.Tensor:
    """[..., V] -> [...] the index of each row's largest logit, the first among ties (as argmax).
    `max` rather than `argmax`: on a CPU, torch's argmax reduction over SmolLM2's 49,152 logits
    took 69 us a row (197 us for 4 rows) against max's 24 us (48 us) on the AMX kind; every greedy
    choice of decoding and verification goes through here, so vanilla and EAGLE pick alike."""
    return logits.max(dim=-1).indices


def verify_greedy(
    tree_tokens: torch.Tensor, target_logits: torch.Tensor,
    retrieve_indices: torch.Tensor | Sequence[Sequence[int]]
) -> Acceptance:
    """Accept the longest path prefix that matches the target's argmax.

    tree_tokens: [N] long (node 0 = root); target_logits: [N, V], the target's logits at each node
    (predicting the token after it); retrieve_indices: [L, D+1], -1 padded, a tensor or its rows
    as lists (TreeBuffers.paths: no device round trip per step).
    """
    predicted = greedy_ids(target_logits).tolist()  # [N]
    tokens = tree_tokens.tolist()
    # A draft token is accepted when the target, one node up the path, would have chosen it; the
    # walk is plain Python: a tree has a few dozen paths at most, and a tensor op costs more.
    if isinstance(retrieve_indices, torch.Tensor):
        retrieve_indices = retrieve_indices.tolist()
    best, longest = [0], -1
    for row in retrieve_indices:
        a = 0
        while a + 1 < len(row) and row[a + 1] >= 0 and tokens[row[a + 1]] == predicted[row[a]]:
            a += 1
        if a > longest:  # the first row among ties
            best, longest = list(row[: a + 1]), a
    path = torch.tensor(best, dtype=torch.long, device=tree_tokens.device)
    return Acceptance(path, tree_tokens[path[1:]], predicted[best[-1]])


def verify_sampling(
    tree_tokens: torch.Tensor,
    target_probs: torch.Tensor | Callable[[int], torch.Tensor],
    parents: torch.Tensor,
    generator: torch.Generator | None = None,
) -> Acceptance:
    """Multi-round speculative sampling over siblings with point-mass draft proposals.

    tree_tokens: [N] long (node 0 = root); target_probs: [N, V], p at each node, or a function
    node -> p [V] (only the a+1 visited nodes need p: top-p sorts the vocabulary, per node);
    parents: [N] long, topologically ordered, siblings in draft-rank order.
    """
    probs_at = target_probs if callable(target_probs) else target_probs.__getitem__
    n = tree_tokens.numel()
    tokens = tree_tokens.tolist()
    children: list[list[int]] = [[] for _ in range(n)]
    for child, parent in enumerate(parents.tolist()[1:], start=1):
        children[parent].append(child)

    path = [0]
    node = 0
    while True:
        p0 = probs_at(node)  # [V]
        p = p0.clone()
        accepted = None
        for child in children[node]:
            token = tokens[child]
            # float64: a float32 draw lies on a 2^-24 grid, and would accept a token of p below
            # 2^-24 (a confident target's low-ranked sibling) with probability 2^-24, not p
            u = torch.rand((), generator=generator, dtype=torch.float64, device=p.device)
            if bool(u < p[token].double()):  # accept with probability min(1, p / q), q = 1
                accepted = child
                break
            p[token] = 0.0
            total = p.sum()
            # Only a p that was not normalised to begin with can leave nothing behind.
            p = p / total if bool(total > 0) else p0.clone()
        if accepted is None:
            next_token = int(torch.multinomial(p, 1, generator=generator))
            break
        node = accepted
        path.append(node)

    path_t = torch.tensor(path, dtype=torch.long, device=tree_tokens.device)
    return Acceptance(path_t, tree_tokens[path_t[1:]], next_token)


def verify_chosen(tree_tokens: torch.Tensor, target_token: Callable[[int], int], parents: torch.Tensor) -> Acceptance:
    """Greedy verification against a target that chooses one token per node (reproducible sampling:
    the perturbed argmax at the node's sequence position). From the root down, accept the child
    whose token the target chose at its parent; the target's choice at the last accepted node is
    the bonus token. Only the a+1 visited nodes are asked (a choice costs a top-p pass and noise).

    tree_tokens: [N] long (node 0 = root); target_token: node -> token id; parents: [N] long,
    topologically ordered. Siblings carry distinct tokens (top-k children), so at most one matches.
    """
    tokens = tree_tokens.tolist()
    children: list[dict[int, int]] = [{} for _ in tokens]
    for child, parent in enumerate(parents.tolist()[1:], start=1):
        children[parent].setdefault(tokens[child], child)
    path = [0]
    while True:
        chosen = target_token(path[-1])
        child = children[path[-1]].get(chosen)
        if child is None:
            break
        path.append(child)
    path_t = torch.tensor(path, dtype=torch.long, device=tree_tokens.device)
    return Acceptance(path_t, tree_tokens[path_t[1:]], chosen)
