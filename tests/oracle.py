"""Drafters with known quality, for greedy-equality tests: one that is always right."""

import torch

from eaglespec.core.tree import buffers_from_parents
from eaglespec.draft.drafter import DraftTree


class OracleDrafter:
    """Drafts the target's own greedy continuation at rank 0 of every node (always right) and
    random other tokens at ranks >= 1 (always wrong). `parents` gives the tree shape."""

    hidden_layers = None  # reads the target's features (and ignores them)

    def __init__(self, target, prompt: list[int], parents: list[int], seed: int = 0, prompts: list[list[int]] | None = None):
        """prompts: for a batch, the prompts in the order their sequences join (default: `prompt`
        for every one)."""
        self.target, self.prompt, self.parents = target, prompt, parents
        self.max_nodes = len(parents)
        self.g = torch.Generator().manual_seed(seed)
        self._firsts = iter([p[0] for p in prompts]) if prompts else None

    # the batch drafter's interface (see draft/drafter.py): a state holds one history per row
    def new_state(self, rows: int = 1, slots: int = 0) -> "Rows":
        return Rows([next(self._firsts) if self._firsts else self.prompt[0]] for _ in range(rows))

    def absorb(self, state, new_tokens, new_features) -> None:
        state[0].extend(new_tokens.tolist())

    def draft_rows(self, state, new_tokens, new_features, roots, noise=None) -> list[DraftTree]:
        return [self.draft_one(h, t, f, root) for h, t, f, root in zip(state, new_tokens, new_features, roots)]

    def draft_one(self, history: list[int], new_tokens, new_features, root) -> DraftTree:
        history.extend(new_tokens.tolist())
        assert history[-1] == root
        tokens, rank = [root], [0]
        children = {}
        for i, p in enumerate(self.parents[1:], start=1):
            r = len(children.setdefault(p, []))
            children[p].append(i)
            rank.append(r)
            if r == 0 and rank[p] == 0 and all(rank[a] == 0 for a in self._ancestors(p)):
                path = [tokens[a] for a in reversed([p] + self._ancestors(p))]
                ids = torch.tensor([history + path[1:]])
                tokens.append(int(self.target.model(ids).logits[0, -1].argmax()))
            else:
                tokens.append(int(torch.randint(0, self.target.vocab_size, (1,), generator=self.g)))
        return DraftTree(torch.tensor(tokens), buffers_from_parents(torch.tensor(self.parents)))

    def _ancestors(self, n):
        out = []
        while self.parents[n] >= 0:
            n = self.parents[n]
            out.append(n)
        return out


class Rows(list):
    """The rows' histories, selected and extended as the batch's rows are."""

    def select(self, rows: list[int]) -> None:
        self[:] = [self[r] for r in rows]
