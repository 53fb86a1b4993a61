"""Grows a draft tree with an EAGLE head (EAGLE-1 or EAGLE-3, through the contract of
draft/heads.py): EAGLE-1 static trees and EAGLE-2 dynamic trees.

The head consumes (token, hidden) pairs. Pairs built from the target's real states (the feature f
for EAGLE-1, the fused layers for EAGLE-3, both through `head.encode`) are kept in the head's KV
cache across steps; pairs built from the head's own outputs (the tree being drafted) are appended
during drafting and cropped away afterwards. Each depth level costs one head forward over all the
nodes of that level that get children. Draft ids become target ids before they enter the tree.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from ..attention import additive_mask
from ..config import DynamicTreeSpec
from ..kv_cache import cache_length, crop
from ..tree import StaticTree, TreeBuffers, buffers_from_parents, select_best_nodes


@dataclass(frozen=True)
class DraftTree:
    tokens: torch.Tensor   # [N] long, node 0 = root (the token the target already chose)
    buffers: TreeBuffers


@dataclass
class DraftState:
    """Per-request head state, owned by the generator."""

    cache: DynamicCache


class _Growth:
    """The nodes drafted so far in one step (root = 0), their head outputs and head-cache slots."""

    def __init__(self, root: int, root_feature: torch.Tensor, device):
        self.tokens = [root]
        self.parents = [-1]
        self.scores = [0.0]
        self.depths = [0]
        self.out = {0: root_feature}  # node -> head output (predicted feature whose LM head gives its children)
        self.slots: list[int] = []    # nodes in head-cache order (processed tree nodes)
        self.device = device

    def add(self, token: int, parent: int, score: float) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.scores.append(score)
        self.depths.append(self.depths[parent] + 1)
        return len(self.tokens) - 1

    def ancestor_mask(self, nodes: list[int]) -> torch.Tensor:
        """[len(nodes), len(slots)] bool: slot's node is an ancestor of the node."""
        rows = []
        for n in nodes:
            chain, a = set(), self.parents[n]
            while a > 0:
                chain.add(a)
                a = self.parents[a]
            rows.append([s in chain for s in self.slots])
        return torch.tensor(rows, dtype=torch.bool, device=self.device).reshape(len(nodes), len(self.slots))


class Drafter:
    def __init__(self, head, target, tree, draft_vocab: torch.Tensor | None = None):
        """head: EagleHead or Eagle3Head. tree: StaticTree or DynamicTreeSpec. draft_vocab: [Vd]
        target token ids an EAGLE-1 draft may propose (a reduced vocabulary, FR-Spec style), or None
        for the full vocabulary; an EAGLE-3 head brings its own."""
        self.head = head.eval()
        self.target = target
        self.tree = tree
        self.hidden_layers = head.hidden_layers  # what the target must return for this head
        self.lm = head.draft_lm(target, draft_vocab)
        self.dtype = next(head.parameters()).dtype
        if isinstance(tree, StaticTree):
            self.max_nodes = tree.num_nodes
            topk = tree.topk_per_node().tolist()
            # per depth: the nodes that get children, and the children (node, parent, rank) to create
            self._levels = [([n for n in tree.level(d).tolist() if topk[n] > 0],
                             [(c, int(tree.parents[c]), int(tree.ranks[c])) for c in tree.level(d + 1).tolist()])
                            for d in range(tree.depth)]
            self._k = max(topk)
        else:
            self.max_nodes = tree.total_tokens + 1

    def new_state(self) -> DraftState:
        return DraftState(DynamicCache(config=self.head.cache_config))

    # -- head pieces ---------------------------------------------------------------------------
    def _draft_logprobs(self, out: torch.Tensor) -> torch.Tensor:
        """[M, H] head outputs -> [M, Vd] draft log-probabilities q (over the draft vocabulary)."""
        return self.lm.logprobs(out)

    def _to_target_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm.to_target_ids(ids)

    def _head(self, state: DraftState, tokens: torch.Tensor, hidden: torch.Tensor, allowed: torch.Tensor,
              positions: torch.Tensor) -> torch.Tensor:
        """tokens [M], hidden [M, H], allowed [M, cache+M] bool, positions [M] -> head outputs [M, H]."""
        embeds = self.target.embed_tokens(tokens.to(self.target.device))[None]
        mask = additive_mask(allowed, self.dtype)
        out = self.head(embeds, hidden[None], attention_mask=mask, position_ids=positions[None], cache=state.cache)
        return out[0]

    # -- one drafting step --------------------------------------------------------------------
    @torch.no_grad()
    def draft(self, state: DraftState, new_tokens: torch.Tensor, new_features: torch.Tensor, root: int) -> DraftTree:
        """new_tokens [P] (x[t+1]) and new_features [P, k*H] (the target's states at t, as
        `hidden_layers` asks): the real pairs not yet in the head cache, the last pair ending with
        the root token. Returns the tree rooted at `root`."""
        device = new_features.device
        new_features = self.head.encode(new_features.to(self.dtype))
        real = cache_length(state.cache)
        p = new_tokens.numel()
        causal = torch.ones(p, p, dtype=torch.bool, device=device).tril()
        allowed = torch.cat([torch.ones(p, real, dtype=torch.bool, device=device), causal], dim=1)
        out = self._head(state, new_tokens, new_features, allowed, torch.arange(real, real + p, device=device))
        real += p
        g = _Growth(root, out[-1], device)
        if isinstance(self.tree, StaticTree):
            self._grow_static(state, g, real)
            crop(state.cache, real)  # forget the pairs built from predicted features
            tokens = torch.tensor(g.tokens, dtype=torch.long, device=device)
            return DraftTree(tokens, self.tree.buffers)
        keep = self._grow_dynamic(state, g, real)
        crop(state.cache, real)
        return self._finish(g, keep, device)

    def _expand(self, state: DraftState, g: _Growth, nodes: list[int], real: int) -> None:
        """One head forward over `nodes` (all of one depth): fills g.out for each."""
        feats = torch.stack([g.out[g.parents[n]] for n in nodes])
        tokens = torch.tensor([g.tokens[n] for n in nodes], device=g.device)
        m = len(nodes)
        allowed = torch.cat([
            torch.ones(m, real, dtype=torch.bool, device=g.device),
            g.ancestor_mask(nodes),
            torch.eye(m, dtype=torch.bool, device=g.device),
        ], dim=1)
        positions = torch.tensor([real - 1 + g.depths[n] for n in nodes], device=g.device)
        out = self._head(state, tokens, feats, allowed, positions)
        for i, n in enumerate(nodes):
            g.out[n] = out[i]
        g.slots.extend(nodes)

    def _grow_static(self, state: DraftState, g: _Growth, real: int) -> None:
        for d, (expand, children) in enumerate(self._levels):
            if d > 0:
                self._expand(state, g, expand, real)
            logp = self._draft_logprobs(torch.stack([g.out[n] for n in expand]))
            top_lp, top_ids = logp.topk(self._k, dim=-1)
            top_lp, top_ids = top_lp.tolist(), self._to_target_ids(top_ids).tolist()
            row = {n: i for i, n in enumerate(expand)}
            for child, par, rank in children:
                r = row[par]
                node = g.add(top_ids[r][rank], par, g.scores[par] + top_lp[r][rank])
                assert node == child, "static tree levels must be contiguous and ordered"

    def _grow_dynamic(self, state: DraftState, g: _Growth, real: int) -> torch.Tensor:
        spec: DynamicTreeSpec = self.tree
        frontier = [0]
        for d in range(spec.depth):
            if d > 0:
                self._expand(state, g, frontier, real)
            logp = self._draft_logprobs(torch.stack([g.out[n] for n in frontier]))  # [F, Vd]
            top_lp, top_ids = logp.topk(spec.top_k, dim=-1)
            base = torch.tensor([g.scores[n] for n in frontier], device=logp.device)[:, None]
            cum = (base + top_lp).flatten()  # [F * k]
            ids, cum_list = self._to_target_ids(top_ids).flatten().tolist(), cum.tolist()
            created = [g.add(ids[i], frontier[i // spec.top_k], cum_list[i]) for i in range(len(ids))]
            best = cum.topk(min(spec.top_k, cum.numel())).indices.tolist()
            frontier = [created[b] for b in sorted(best)]
        candidates = torch.tensor(g.scores[1:])
        parents = torch.tensor([p - 1 for p in g.parents[1:]])  # candidate indices; root -> -1
        chosen = select_best_nodes(candidates, parents, spec.total_tokens)
        return torch.cat([torch.zeros(1, dtype=torch.long), chosen + 1])

    @staticmethod
    def _finish(g: _Growth, keep: torch.Tensor, device) -> DraftTree:
        """Renumber the kept nodes 0..N-1 (keep is ascending, root first, closed under parents)."""
        keep_list = keep.tolist()
        new_index = {old: i for i, old in enumerate(keep_list)}
        parents = torch.tensor([-1] + [new_index[g.parents[o]] for o in keep_list[1:]], dtype=torch.long)
        tokens = torch.tensor([g.tokens[o] for o in keep_list], dtype=torch.long, device=device)
        return DraftTree(tokens, buffers_from_parents(parents))
