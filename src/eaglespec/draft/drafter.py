"""Grows a draft tree with an EAGLE head (EAGLE-1 or EAGLE-3, through the contract of
draft/contract.py): EAGLE-1 static trees and EAGLE-2 dynamic trees.

The head consumes (token, hidden) pairs. Pairs built from the target's real states (the feature f
for EAGLE-1, the fused layers for EAGLE-3, both through `head.encode`) are kept in the head's KV
cache across steps; pairs built from the head's own outputs (the tree being drafted) are appended
during drafting and cropped away afterwards. Each depth level costs one head forward over all the
nodes of that level that get children. Draft ids become target ids before they enter the tree.
In reproducible sampling a row's children are ranked by q perturbed with the target's own keyed
noise at their position (core/noise.py), so its first child is the target's token whenever the
draft's perturbed choice agrees with the target's.

A tree may have a confidence floor (`Drafter.floor`), used when one sequence drafts alone. In a
static tree a node whose path probability under the draft (the product of q along it, without
noise) is below it is not verified, and a level none of whose nodes reaches it is not drafted (a
node below the floor on a level drafted for its siblings is drafted, then dropped). In a dynamic
tree the floor only stops the drafting (a level none of whose frontier nodes reaches it is not
drafted) and the best N of the nodes drafted are verified: a few more tokens cost little to
verify, a level costs a head forward. The draft's confidence tracks acceptance closely (EAGLE-2),
so where the head is unsure a step drafts less, and where it is sure it drafts the whole tree.
Which nodes are verified never changes an output: every tree is verified exactly. A batch of
several sequences drafts its trees whole: the rows share each level's head forward and one
verification width, so cutting one row saves little, and the widths a batch verifies stay the few
`warm_batches` builds.

With a reduced draft vocabulary (an EAGLE-1 head's most frequent tokens, FR-Spec style), a row's
draft also scores its own context tokens that the vocabulary leaves out (`context_vocab`, on by
default): the tokens of its prompt (after the first) and of its output so far, as the head absorbs
them (at most CONTEXT_MAX), with the target LM head's rows for them. q is renormalised over the union (the vocabulary's normaliser comes
back from draft id 0's raw score), so names, numbers and code identifiers copied from the prompt, or
repeated from the reply, can be drafted although the vocabulary misses them. It costs one small
product a level (the row's context tokens, tens to a few hundred).

`rerank` (--tree auto's tuned trees): one sequence alone grows a static tree of N nodes and depth
D as EAGLE-2 does, dynamic:k,D,N (each level expands the k nodes with the best path scores, and the
N best of all are verified), so that each step's nodes follow the draft's confidence rather than
the ranks' average acceptance; a batch of several drafts the static shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from ..core.attention import additive_mask
from ..core.config import DynamicTreeSpec
from ..core.noise import DraftNoise, perturbed_logprobs
from ..core.tree import StaticTree, TreeBuffers, best_nodes, buffers_from_parents
from ..engine.kv_cache import RowCache
from .contract import DraftLM


SHAPES_KEPT = 256  # tree shapes (floored or dynamic) whose buffers a drafter keeps (the least recently used go)


@dataclass(frozen=True)
class DraftTree:
    tokens: torch.Tensor   # [N] long, node 0 = root (the token the target already chose)
    buffers: TreeBuffers
    levels: int | None = None  # head levels drafted for it (a floor may stop early); None: not said


CONTEXT_MAX = 1024  # context tokens a row's draft scores beyond its vocabulary (the first ones seen): a long
                   # prompt's would otherwise grow each level's product and the rows rebuilt as it grows


class _Context:
    """One row's context tokens outside the draft vocabulary (target ids, in order of first
    appearance, at most CONTEXT_MAX), and the target LM head's rows for them, headed by draft id
    0's row (whose raw score gives back the draft vocabulary's normaliser), built when the set grows."""

    def __init__(self):
        self.ids: list[int] = []
        self._seen: set[int] = set()
        self._built: tuple[int, torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None

    def add(self, tokens: list[int], in_main: list[bool]) -> None:
        for t in tokens:
            if len(self.ids) >= CONTEXT_MAX:
                return
            if not in_main[t] and t not in self._seen:
                self._seen.add(t)
                self.ids.append(t)

    def rows(self, lm, full_w: torch.Tensor, full_b: torch.Tensor | None):
        """-> (ids [X], weight [1 + X, H], bias [1 + X] or None, table [Vd + X]: the target id of
        every draft id) for the ids so far."""
        if self._built is None or self._built[0] != len(self.ids):
            ids = torch.tensor(self.ids, dtype=torch.long, device=full_w.device)
            # scored in the target LM head's dtype (draft id 0's row too: the head's may be bf16)
            w = torch.cat([lm.weight[:1].to(full_w.dtype), full_w[ids]])
            b = None if full_b is None else torch.cat([lm.bias[:1].to(full_b.dtype), full_b[ids]])
            self._built = (len(self.ids), ids, w, b, torch.cat([lm.target_ids.to(ids.device), ids]))
        return self._built[1:]


@dataclass
class DraftState:
    """The head's state for the rows of a batch (one row per sequence), owned by the generator:
    its KV cache over the real (token, hidden) pairs each row has seen, and each row's context
    tokens outside the draft vocabulary (Drafter.context_vocab)."""

    rows: RowCache
    context: list[_Context] = field(default_factory=list)

    def select(self, rows: list[int]) -> None:
        self.rows.select(rows)
        self.context = [self.context[r] for r in rows]

    def extend(self, other: "DraftState") -> None:
        self.rows.extend(other.rows)
        self.context += other.context


class _Growth:
    """The nodes drafted so far in one step (root = 0), their head outputs and head-cache slots."""

    def __init__(self, root: int, root_feature: torch.Tensor, device):
        self.tokens = [root]
        self.parents = [-1]
        self.scores = [0.0]
        self.conf = [0.0]  # log of the path's probability under q (no noise): what the floor reads
        self.depths = [0]
        self.out = {0: root_feature}  # node -> head output (predicted feature whose LM head gives its children)
        self.slots: list[int] = []    # nodes in head-cache order (processed tree nodes)
        self.device = device

    def add(self, token: int, parent: int, score: float, logq: float | None = None) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.scores.append(score)
        self.conf.append(self.conf[parent] + (score - self.scores[parent] if logq is None else logq))
        self.depths.append(self.depths[parent] + 1)
        return len(self.tokens) - 1

    def block_rows(self, nodes: list[int]) -> list[list[bool]]:
        """What each of `nodes` sees of the head-cache slots drafted this step, then of the nodes
        appended with it: [len(nodes)][len(slots) + len(nodes)], its ancestors' slots and itself."""
        rows = []
        for i, n in enumerate(nodes):
            chain, a = set(), self.parents[n]
            while a > 0:
                chain.add(a)
                a = self.parents[a]
            rows.append([s in chain for s in self.slots] + [j == i for j in range(len(nodes))])
        return rows


class EagerHeadSteps:
    """The head's forward on the stock eager kernels, over a DynamicCache (kv_cache.RowCache)."""

    def __init__(self, head, target):
        self.head, self.target = head, target
        self.dtype = next(head.parameters()).dtype

    def new_rows(self, rows: int, slots: int = 0) -> RowCache:
        return RowCache(DynamicCache(config=self.head.cache_config), [0] * rows)

    def forward(self, rows: RowCache, base: int, tokens, hidden, block, positions, pad_to: int = 0) -> torch.Tensor:
        """See Drafter._head; appends M slots to the head cache. pad_to: for compiled steps only."""
        embeds = self.target.embed_tokens(tokens.to(self.target.device)).to(self.dtype)
        m = tokens.shape[1]
        real = rows.valid(base, block.device)[:, None, :].expand(-1, m, -1)
        mask = additive_mask(torch.cat([real, block], dim=2), self.dtype)
        return self.head(embeds, hidden, attention_mask=mask, position_ids=positions, cache=rows.cache)

    def logprobs(self, lm, out: torch.Tensor) -> torch.Tensor:
        """[B, E, H] head outputs -> [B, E, Vd] log q (DraftLM.logprobs)."""
        return lm.logprobs(out)


def scores_context(head, draft_vocab: torch.Tensor | None, context_vocab: bool) -> bool:
    """Whether a drafter of `head` over `draft_vocab` scores the context tokens: asked, with a
    reduced vocabulary cut from the target's (an EAGLE-3 head drafts over its own)."""
    return bool(context_vocab and draft_vocab is not None and not head.own_vocabulary)


class Drafter:
    def __init__(self, head, target, tree, draft_vocab: torch.Tensor | None = None, floor: float = 0.0,
                 rerank: int = 0, context_vocab: bool = True, lm: DraftLM | None = None):
        """head: EagleHead or Eagle3Head. tree: StaticTree or DynamicTreeSpec. draft_vocab: [Vd]
        target token ids an EAGLE-1 draft may propose (a reduced vocabulary, FR-Spec style), or None
        for the full vocabulary; an EAGLE-3 head brings its own. floor: the confidence floor of a
        lone sequence's tree (module docstring; 0 = the whole tree every step). rerank: k > 0 grows
        a static tree for a lone sequence as dynamic:k,D,N of its depth D and N draft nodes.
        context_vocab: with a reduced draft vocabulary, a row's draft also scores the tokens of its
        own context (prompt and output so far) that the vocabulary leaves out (module docstring).
        lm: the head's draft LM head over draft_vocab in the head's dtype, when the caller keeps one
        for several drafters (else made here: a cut copy of the target's for an EAGLE-1 head)."""
        if not 0.0 <= floor < 1.0:
            raise ValueError(f"the draft floor is a probability in [0, 1), got {floor}")
        if rerank < 0:
            raise ValueError(f"rerank is a top-k (0: off), got {rerank}")
        self.floor, self.rerank = floor, rerank
        self._shapes: dict[tuple[int, ...], TreeBuffers] = {}  # parent arrays -> their tree's buffers
        self.head = head.eval()
        self.target = target
        self.tree = tree
        self.hidden_layers = head.hidden_layers  # what the target must return for this head
        self.dtype = next(head.parameters()).dtype
        self.lm = lm if lm is not None else head.draft_lm(target, draft_vocab).to(self.dtype)
        self.context_vocab = scores_context(head, draft_vocab, context_vocab)
        if self.context_vocab:
            in_main = torch.zeros(target.vocab_size, dtype=torch.bool)
            in_main[self.lm.target_ids.cpu()] = True
            self._in_main = in_main.tolist()
            self._full = (target.lm_head.weight, target.lm_head.bias)
        self.steps = target.steps.head_steps(head)  # the head's forward: eager or compiled, as the target's
        if isinstance(tree, StaticTree):
            self.max_nodes = tree.num_nodes
            topk = tree.topk_per_node().tolist()
            # per depth: the nodes that get children, and the children (node, parent, rank) to create
            self._levels = [([n for n in tree.level(d).tolist() if topk[n] > 0],
                             [(c, int(tree.parents[c]), int(tree.ranks[c])) for c in tree.level(d + 1).tolist()])
                            for d in range(tree.depth)]
            self._k = max(topk)
            self._lone = DynamicTreeSpec(rerank, tree.depth, tree.num_nodes - 1) if rerank and tree.depth else tree
        else:
            self._lone = tree
            self.max_nodes = tree.total_tokens + 1
        # a step's new real pairs: the accepted tokens and the next one, at most depth + 1 (more
        # after steps without drafts); a compiled head pads to this, so one graph serves them all
        self.absorb_width = tree.depth + 1

    def new_state(self, rows: int = 1, slots: int = 0) -> DraftState:
        """slots: the most pairs and tree nodes a row will hold (a compiled head sizes its cache
        for them at once; 0: the smallest size, grown as needed)."""
        return DraftState(self.steps.new_rows(rows, slots), [_Context() for _ in range(rows)])

    # -- head pieces ---------------------------------------------------------------------------
    def _draft_logprobs(self, state: DraftState, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """[B, E, H] head outputs -> ([B, E, V'] draft log-probabilities q, [B, V'] the target id of
        each draft id, or None: the draft vocabulary's own map). q is over the draft vocabulary (on
        the head's backend; compiled: one graph per shape bucket), and with context_vocab over it
        and each row's context tokens outside it (padded per row with q = -inf), renormalised over
        the two: the vocabulary's normaliser comes back from draft id 0's raw score, computed here
        beside the context rows' (to within the rounding of one logit when the head runs in bf16:
        the proposals are point masses, so q only ranks them and never changes an output)."""
        q = self.steps.logprobs(self.lm, out)
        if not self.context_vocab or not any(c.ids for c in state.context):
            return q, None
        b = q.shape[0]
        rows = [c.rows(self.lm, *self._full) for c in state.context]
        assert len(rows) == b, "a draft state holds one context per row"
        linear = torch.nn.functional.linear  # as draft_logprobs scores: draft id 0's raw score is its logit
        if b == 1:  # a lone sequence (the common case): its own rows, no padding
            _, weight, bias, table = rows[0]
            raw = linear(out.to(weight.dtype), weight, bias).float()  # [1, E, 1 + X]
            table = table[None]
        else:  # each row's own product (no copy of the rows), its scores padded with -inf
            x = max(len(r[0]) for r in rows)
            raw = torch.full((b, q.shape[1], 1 + x), -math.inf, dtype=torch.float32, device=q.device)
            table = torch.zeros(b, q.shape[-1] + x, dtype=torch.long, device=q.device)
            for r, (ids, w, bb, t) in enumerate(rows):
                raw[r, :, : 1 + len(ids)] = linear(out[r].to(w.dtype), w, bb)
                table[r, : t.numel()] = t
        lse_main = raw[..., :1] - q[..., :1]  # draft id 0: raw score minus its log q
        lse = torch.logaddexp(lse_main, torch.logsumexp(raw[..., 1:], dim=-1, keepdim=True))
        return torch.cat([q + (lse_main - lse), raw[..., 1:] - lse], dim=-1), table

    def _to_target_ids(self, ids: torch.Tensor, table: torch.Tensor | None) -> torch.Tensor:
        """Draft ids [B, ...] -> target ids, through the rows' table (or the vocabulary's map)."""
        if table is None:
            return self.lm.to_target_ids(ids)
        return torch.gather(table, 1, ids.reshape(ids.shape[0], -1)).view(ids.shape)

    def _ranked(self, logp: torch.Tensor, noise: list[DraftNoise | None] | None, depth: int,
                table: torch.Tensor | None = None) -> torch.Tensor:
        """[B, E, V'] draft log-probabilities of the depth-`depth` nodes -> what their children are
        ranked and scored by: q itself, or for a row with noise q perturbed at its position."""
        if noise is None or all(n is None for n in noise):
            return logp
        every = torch.arange(logp.shape[-1], device=logp.device)
        ids = self._to_target_ids(every.expand(logp.shape[0], -1), table)  # [B, V'] target ids
        return torch.stack([lp if n is None else perturbed_logprobs(lp, n, depth, row_ids).to(lp.dtype)
                            for lp, n, row_ids in zip(logp, noise, ids)])

    def _head(self, state: DraftState, base: int, tokens: torch.Tensor, hidden: torch.Tensor, block: torch.Tensor,
              positions: torch.Tensor, pad_to: int = 0) -> torch.Tensor:
        """Append M pairs per row to the head cache and run the head over them.

        base: cache slots before this step's appended blocks (row r's real pairs are [0, lens[r]));
        tokens [B, M], hidden [B, M, H], block [B, M, A] bool over the slots appended since `base`
        (this call's M included), positions [B, M] -> head outputs [B, M, H]."""
        return self.steps.forward(state.rows, base, tokens, hidden, block, positions, pad_to)

    # -- one drafting step --------------------------------------------------------------------
    @torch.no_grad()
    def draft(self, state: DraftState, new_tokens: torch.Tensor, new_features: torch.Tensor, root: int) -> DraftTree:
        """One sequence (a state of one row): see `draft_rows`."""
        return self.draft_rows(state, [new_tokens], [new_features], [root])[0]

    @torch.no_grad()
    def draft_rows(self, state: DraftState, new_tokens: list[torch.Tensor], new_features: list[torch.Tensor],
                   roots: list[int], noise: list[DraftNoise | None] | None = None) -> list[DraftTree]:
        """For each row r: new_tokens[r] [P] (x[t+1]) and new_features[r] [P, k*H] (the target's
        states at t, as `hidden_layers` asks) are the real pairs not yet in the head cache, the last
        pair ending with the root token. Every row's tree has the same shape (the static tree, or
        the dynamic tree's top-k frontier per depth), so each depth is one head forward for the
        whole batch. noise[r]: a reproducible row's keyed noise (None: rank by q). The confidence
        floor applies to one row alone. Returns each row's tree rooted at roots[r]."""
        device = new_features[0].device
        counts = [t.numel() for t in new_tokens]
        out = self._absorb(state, new_tokens, new_features)
        growths = [_Growth(root, out[r, counts[r] - 1], device) for r, root in enumerate(roots)]
        base = state.rows.length
        lone = len(roots) == 1
        floor = self.floor if lone else 0.0  # a batch of several drafts its trees whole
        tree = self._lone if lone else self.tree
        if isinstance(tree, StaticTree):
            levels = self._grow_static(state, growths, base, noise, floor)
            state.rows.crop(base)  # forget the pairs built from predicted features
            return [self._floored(g, device, floor, levels) for g in growths]
        keeps, levels = self._grow_dynamic(state, growths, base, noise, floor, tree)
        state.rows.crop(base)
        return [self._finish(g, keep, device, levels) for g, keep in zip(growths, keeps)]

    @torch.no_grad()
    def absorb(self, state: DraftState, new_tokens: torch.Tensor, new_features: torch.Tensor) -> None:
        """Feed one row's real pairs (a prompt's, when a sequence joins a batch) into the head
        cache ahead of its first draft, so that the batch's first drafting pass is not padded to
        the prompt's length."""
        if new_tokens.numel():
            self._absorb(state, [new_tokens], [new_features])

    def _absorb(self, state: DraftState, new_tokens: list[torch.Tensor], new_features: list[torch.Tensor]) -> torch.Tensor:
        """Run the head over each row's new real pairs and keep them in its cache. -> [B, P, H]."""
        device = new_features[0].device
        b, counts = len(new_tokens), [t.numel() for t in new_tokens]
        p = max(counts)
        encoded = [self.head.encode(f.to(self.dtype)) for f in new_features]  # [P, H] each
        causal = torch.ones(1, p, p, dtype=torch.bool, device=device).tril()
        if b == 1:  # one sequence: no padding to build (a drafting step's common case)
            tokens, hidden, block = new_tokens[0].to(device)[None], encoded[0][None], causal
        else:
            tokens = torch.zeros(b, p, dtype=torch.long, device=device)
            hidden = encoded[0].new_zeros(b, p, encoded[0].shape[-1])
            for r, (t, e) in enumerate(zip(new_tokens, encoded)):
                tokens[r, : counts[r]] = t
                hidden[r, : counts[r]] = e
            # row r's pairs are causal among themselves; its padding sees only itself
            real_pair = torch.arange(p, device=device)[None] < torch.tensor(counts, device=device)[:, None]  # [B, P]
            block = (causal & real_pair[:, None, :]) | torch.eye(p, dtype=torch.bool, device=device)[None]
        base = state.rows.length
        positions = torch.tensor([[n + i for i in range(p)] for n in state.rows.lens.tolist()], device=device)
        out = self._head(state, base, tokens, hidden, block, positions, pad_to=self.absorb_width)
        state.rows.keep_paths(base, [torch.arange(c) for c in counts])
        if self.context_vocab:
            for c, t in zip(state.context, new_tokens):
                c.add(t.tolist(), self._in_main)
        return out

    def _expand(self, state: DraftState, growths: list[_Growth], nodes: list[list[int]], base: int) -> None:
        """One head forward over nodes[r] of every row (all of one depth, as many per row): fills
        g.out for each."""
        device = growths[0].device
        b, m = len(growths), len(nodes[0])
        feats = torch.stack([g.out[g.parents[n]] for g, ns in zip(growths, nodes) for n in ns]).view(b, m, -1)
        tokens = torch.tensor([[g.tokens[n] for n in ns] for g, ns in zip(growths, nodes)], device=device)
        block = torch.tensor([g.block_rows(ns) for g, ns in zip(growths, nodes)], dtype=torch.bool, device=device)
        positions = torch.tensor([[length - 1 + g.depths[n] for n in ns]
                                  for length, g, ns in zip(state.rows.lens.tolist(), growths, nodes)], device=device)
        out = self._head(state, base, tokens, feats, block, positions)
        for r, (g, ns) in enumerate(zip(growths, nodes)):
            for i, n in enumerate(ns):
                g.out[n] = out[r, i]
            g.slots.extend(ns)

    def _grow_static(self, state: DraftState, growths: list[_Growth], base: int,
                     noise: list[DraftNoise | None] | None, floor: float = 0.0) -> int:
        """Grow the static tree level by level; -> the levels grown (a floor may stop it early)."""
        floor = math.log(floor) if floor > 0 else -math.inf
        for d, (expand, children) in enumerate(self._levels):
            if d > 0:
                if all(g.conf[n] < floor for g in growths for n in expand):
                    return d  # no row would verify this level's children: it is not drafted
                self._expand(state, growths, [expand] * len(growths), base)
            q, table = self._draft_logprobs(state, torch.stack([g.out[n] for g in growths for n in expand])
                                            .view(len(growths), len(expand), -1))
            logp = self._ranked(q, noise, d, table)
            top_lp, top_ids = logp.topk(self._k, dim=-1)  # [B, E, k]
            top_q = top_lp if logp is q else q.gather(-1, top_ids)
            top_lp, top_q, top_ids = top_lp.tolist(), top_q.tolist(), self._to_target_ids(top_ids, table).tolist()
            row = {n: i for i, n in enumerate(expand)}
            for g, lp, lq, ids in zip(growths, top_lp, top_q, top_ids):
                for child, par, rank in children:
                    i = row[par]
                    node = g.add(ids[i][rank], par, g.scores[par] + lp[i][rank], lq[i][rank])
                    assert node == child, "static tree levels must be contiguous and ordered"
        return len(self._levels)

    def _floored(self, g: _Growth, device, floor: float, levels: int) -> DraftTree:
        """The static tree's nodes this row verifies: all of them, or those at or above the floor
        (closed under parents, since q's path probability only falls along a path; renumbered in
        the tree's order). The buffers of the kept sets seen lately are kept (at most SHAPES_KEPT)."""
        tokens = torch.tensor(g.tokens, dtype=torch.long, device=device)
        if floor <= 0:
            return DraftTree(tokens, self.tree.buffers, levels)
        floor = math.log(floor)
        keep = tuple(n for n, c in enumerate(g.conf) if n == 0 or c >= floor)
        if len(keep) == self.tree.num_nodes:
            return DraftTree(tokens, self.tree.buffers, levels)
        index = {old: new for new, old in enumerate(keep)}
        buffers = self._buffers(tuple([-1] + [index[g.parents[n]] for n in keep[1:]]))
        return DraftTree(tokens[list(keep)], buffers, levels)

    def _grow_dynamic(self, state: DraftState, growths: list[_Growth], base: int,
                      noise: list[DraftNoise | None] | None, floor: float, spec: DynamicTreeSpec
                      ) -> tuple[list[list[int]], int]:
        """EAGLE-2: each level expands the top_k nodes of the one above with the best cumulative
        scores; returns each row's kept nodes (the best total_tokens, root first, ascending) and
        the levels grown. With a floor, a level none of whose frontier nodes reaches it is not
        drafted."""
        k = spec.top_k
        floor = math.log(floor) if floor > 0 else -math.inf
        frontiers = [[0] for _ in growths]
        grown = 0
        for d in range(spec.depth):
            if d > 0:
                if all(g.conf[n] < floor for g, f in zip(growths, frontiers) for n in f):
                    break  # no frontier node reaches the floor: this level is not drafted
                self._expand(state, growths, frontiers, base)
            q, table = self._draft_logprobs(state, torch.stack([g.out[n] for g, f in zip(growths, frontiers) for n in f])
                                            .view(len(growths), len(frontiers[0]), -1))
            logp = self._ranked(q, noise, d, table)
            top_lp, top_ids = logp.topk(k, dim=-1)  # [B, F, k]
            top_q = top_lp if logp is q else q.gather(-1, top_ids)
            top_lp, top_q, top_ids = top_lp.tolist(), top_q.tolist(), self._to_target_ids(top_ids, table).tolist()
            for r, (g, frontier) in enumerate(zip(growths, frontiers)):
                created = [g.add(top_ids[r][i][j], par, g.scores[par] + top_lp[r][i][j], top_q[r][i][j])
                           for i, par in enumerate(frontier) for j in range(k)]
                best = sorted(created, key=lambda n: -g.scores[n])[:k]  # ties: the earlier node
                frontiers[r] = sorted(best)
            grown = d + 1
        keeps = []
        for g in growths:  # candidates 1.. (the root aside)
            kept = best_nodes(g.scores[1:], [p - 1 for p in g.parents[1:]], spec.total_tokens)
            keeps.append([0] + [i + 1 for i in kept])
        return keeps, grown

    def _finish(self, g: _Growth, keep: list[int], device, levels: int) -> DraftTree:
        """Renumber the kept nodes 0..N-1 (keep is ascending, root first, closed under parents);
        the buffers of the shapes seen lately are kept (at most SHAPES_KEPT)."""
        tokens = torch.tensor([g.tokens[o] for o in keep], dtype=torch.long, device=device)
        index = {old: i for i, old in enumerate(keep)}
        parents = tuple([-1] + [index[g.parents[o]] for o in keep[1:]])
        return DraftTree(tokens, self._buffers(parents), levels)

    def _buffers(self, parents: tuple[int, ...]) -> TreeBuffers:
        """The tree buffers of a parent array, from the drafter's store of recent shapes."""
        buffers = self._shapes.pop(parents, None)  # re-inserted last: the store is least-recently-used first
        if buffers is None:
            if len(self._shapes) >= SHAPES_KEPT:
                del self._shapes[next(iter(self._shapes))]
            buffers = buffers_from_parents(torch.tensor(parents, dtype=torch.long))
        self._shapes[parents] = buffers
        return buffers
