"""Sequences that decode together: the one generation loop, for a batch of one or many.

Each step: the drafter grows one tree per sequence in a single drafting pass (one head forward
per depth for the whole batch), the target verifies every tree in one forward (trees padded to
the largest, each row masked to its own cache entries and its own tree), each sequence accepts
its own number of tokens, and only the accepted paths' KV entries and states are kept. Without a
drafter every tree is the root alone: vanilla decoding, batched the same way.

A sequence joins with its own prefill (batch of one) and its cache rows are appended to the
batch's; it leaves by having its rows selected away. This is what the server's continuous
batching runs on: sequences join and leave between steps.

Losslessness per sequence: a row's queries see exactly its own past and tree, at its own
positions, so its logits are those of the sequence decoded alone up to floating-point rounding
(the batch changes the shapes of the matrix products and the length of the masked key axis);
greedy outputs are therefore identical except at a near-tie of the top-2 logits, which the tests
and `eaglespec certify` measure. Reproducible sampling (SamplingParams.mode) makes a sampled
sequence the same: its token at position t is the argmax of its perturbed target there, with noise
keyed on (its seed, t) alone (core/noise.py), so only the same kind of near-tie can change it.
"""

from __future__ import annotations

import copy
import secrets
from dataclasses import dataclass
from typing import Callable

import torch

from ..core.config import REPRODUCIBLE, SamplingParams
from ..core.noise import DraftNoise, key64, perturbed_argmax
from ..core.sampling import logits_to_probs, processed_scores, sample
from ..core.tree import buffers_from_parents
from ..core.verify import Acceptance, greedy_ids, verify_chosen, verify_greedy, verify_sampling
from ..draft.drafter import Drafter, DraftTree
from ..errors import EagleError
from .target import TargetModel

_ROOT_ONLY = buffers_from_parents(torch.tensor([-1]))


@dataclass(frozen=True)
class StepStats:
    accepted: int    # draft tokens the target accepted this step (0 for vanilla)
    emitted: int     # tokens this step added to the output (accepted + 1, cut at a stop or the budget)
    tree_size: int   # tokens the target verified (root included)
    bonus: bool = False  # the target's token ends an accepted path at a leaf of a drafted tree (a bonus token);
                         # False: a recovered token (a node whose children were all rejected), or no draft tree
    levels: int | None = None  # draft levels grown this step (a floor may stop before the tree's depth); None: not said


@dataclass(frozen=True)
class StepOutput:
    tokens: list[int]  # the new tokens, in order
    stats: StepStats
    finish_reason: str | None = None  # on the stream's last output: "stop" (a stop token) or "length"


@dataclass(eq=False)
class Sequence:
    """One sequence's decoding state inside a batch (the batch owns it; callers hold it as a handle)."""

    prompt_tokens: int
    budget: int                    # tokens it may still produce in all (max_new_tokens cut to the context)
    sampling: SamplingParams
    seed: int                      # the seed it samples with: sampling.seed, or a fresh 64-bit one
    generator: torch.Generator     # speculative sampling's draws, seeded with `seed`
    stops: set[int]
    root: int                      # the last token chosen by the target, not yet run by it
    pending_tokens: torch.Tensor   # [P] x[t+1] of the real pairs the head has not seen
    pending_hidden: torch.Tensor   # [P, k*H] the head's input for each of them
    produced: int = 1
    finish_reason: str | None = None
    speculative: bool = True       # drafts for it; False: vanilla steps (a request that asked for no drafting)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def reproducible(self) -> bool:
        return self.sampling.mode == REPRODUCIBLE and not self.sampling.greedy

    @property
    def position(self) -> int:
        """The sequence position of the next token: the root's children's."""
        return self.prompt_tokens + self.produced


class Batch:
    """Owns the target cache rows and the head state of the sequences decoding together."""

    def __init__(self, target: TargetModel, drafter: Drafter | None = None,
                 choose: Callable[[int], Drafter | None] | None = None,
                 report: Callable[[list["Sequence"], list[StepOutput]], None] | None = None):
        """drafter: grows every step's trees (None: vanilla). choose: picks, for each step, the
        drafter (over the same head, any tree) or None (no drafts) from the number of sequences in
        the step, as `--tree auto` does when a larger batch makes drafting pay less. report(seqs,
        outputs) hears each drafting step's sequences and outcomes, in order (tuning.AdaptiveTree's
        feedback)."""
        self.target = target
        self.drafter = drafter
        self.choose = choose or (lambda size: drafter)
        self.report = report
        self.layers = drafter.hidden_layers if drafter else None
        self.sequences: list[Sequence] = []
        self._rows = None  # the target's KV cache, one row per sequence (kv_cache.RowCache or its compiled twin)
        self._draft = drafter.new_state(0) if drafter else None
        self._kept: tuple[tuple[int, ...], object, object] | None = None  # (prompt, cache, states): add(keep_prefill=True)

    def __len__(self) -> int:
        return len(self.sequences)

    # -- joining and leaving ------------------------------------------------------------------
    @torch.no_grad()
    def add(self, input_ids: list[int], max_new_tokens: int, sampling: SamplingParams = SamplingParams(),
            stops: set[int] = frozenset(), keep_prefill: bool = False, speculative: bool = True
            ) -> tuple[Sequence, StepOutput]:
        """Prefill a prompt alone, choose its first token and join the batch. Returns the handle
        and that first output (already finished when it is a stop or the budget is one token).
        speculative=False: this sequence verifies its root alone at every step (vanilla decoding
        inside a drafting batch; a step whose sequences are all vanilla drafts nothing).
        keep_prefill: keep a copy of this prompt's cache so that the next `add` of the same prompt
        copies it instead of running the target again (many samples of one prompt); the copy is
        dropped by the next add of another prompt or without keep_prefill."""
        target = self.target
        if max_new_tokens <= 0:
            raise EagleError(f"max_new_tokens must be > 0, got {max_new_tokens}")
        if not input_ids:
            raise EagleError("the prompt is empty")
        if min(input_ids) < 0 or max(input_ids) >= target.vocab_size:
            raise EagleError(f"prompt token ids must be in [0, {target.vocab_size}), got {min(input_ids)}..{max(input_ids)}")
        n = len(input_ids)
        if n >= target.max_context:
            raise EagleError(f"the prompt has {n} tokens, the model's context is {target.max_context}: shorten the prompt")
        # without a seed, a fresh one per sequence: no two requests share a stream
        seed = key64(sampling.seed) if sampling.seed is not None else secrets.randbits(64)
        generator = torch.Generator(device=target.device)
        generator.manual_seed(sampling.seed if sampling.seed is not None else seed)  # torch's own reading of a negative seed
        ids = torch.tensor(input_ids, device=target.device)
        key = tuple(input_ids)
        kept = self._kept is not None and self._kept[0] == key
        if kept:
            cache, states = copy.deepcopy(self._kept[1]), self._kept[2]  # the same tensors a prefill would give
        else:
            cache = target.new_cache()
            states = target.forward_states(ids[None], cache, layers=self.layers)
        if not keep_prefill:
            self._kept = None
        elif not kept:
            self._kept = (key, copy.deepcopy(cache), states)
        root = _choose(target.logits(states.features[0, -1:]), sampling, seed, generator, n)
        seq = Sequence(n, min(max_new_tokens, target.max_context - n), sampling, seed, generator, set(stops), root,
                       torch.cat([ids[1:], torch.tensor([root], device=target.device)]), states.hidden[0],
                       speculative=speculative)
        seq.finish_reason = "stop" if root in seq.stops else "length" if seq.produced >= seq.budget else None
        first = StepOutput([root], StepStats(0, 1, n), seq.finish_reason)
        if seq.done:
            return seq, first
        slots = n + seq.budget + (self.drafter.max_nodes if self.drafter else 1)
        rows = target.start_rows(cache, [n], slots)
        if self.drafter is not None:
            # the prompt's pairs go into a one-row head state now; only the root's pair stays pending
            state = self.drafter.new_state(1, slots)
            self.drafter.absorb(state, seq.pending_tokens[:-1], seq.pending_hidden[:-1])
            seq.pending_tokens, seq.pending_hidden = seq.pending_tokens[-1:], seq.pending_hidden[-1:]
            self._draft.extend(state)
        if self._rows is None:
            self._rows = rows
        else:
            self._rows.extend(rows)
        self.sequences.append(seq)
        return seq, first

    def remove(self, leaving: list[Sequence]) -> None:
        """Drop sequences (finished, cancelled) and their cache rows."""
        gone = {id(s) for s in leaving}
        keep = [r for r, s in enumerate(self.sequences) if id(s) not in gone]
        if len(keep) == len(self.sequences):
            return
        self.sequences = [self.sequences[r] for r in keep]
        if not keep:  # start the next sequence from fresh caches
            self._rows = None
            self._draft = self.drafter.new_state(0) if self.drafter else None
            return
        self._rows.select(keep)
        if self._draft is not None:
            self._draft.select(keep)

    # -- one step -----------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, observe: Callable[[DraftTree, torch.Tensor, Acceptance], None] | None = None
             ) -> list[tuple[Sequence, StepOutput]]:
        """Draft, verify and accept for every sequence; finished ones leave the batch.
        observe(tree, target_logits [N, V], acceptance) sees every row's verification."""
        if not self.sequences:
            return []
        target, seqs, rows = self.target, self.sequences, self._rows
        drafting = any(s.speculative for s in seqs)
        drafter = self.choose(len(seqs)) if self.drafter is not None and drafting else None
        trees = self._draft_trees(drafter)
        sizes = [t.tokens.numel() for t in trees]
        width = max(sizes)
        tokens = torch.zeros(len(seqs), width, dtype=torch.long, device=target.device)
        tree_mask = torch.eye(width, dtype=torch.bool).repeat(len(seqs), 1, 1)  # padding nodes see themselves
        depth = torch.zeros(len(seqs), width, dtype=torch.long)
        for r, (t, size) in enumerate(zip(trees, sizes)):
            tokens[r, :size] = t.tokens
            tree_mask[r, :size, :size] = t.buffers.tree_mask.cpu()
            depth[r, :size] = t.buffers.tree_position_ids.cpu()
        start = rows.length
        states, all_logits = target.verify_rows(tokens, rows, tree_mask, depth, sizes, self.layers)
        outputs, paths = [], []
        for r, (seq, tree, logits) in enumerate(zip(seqs, trees, all_logits)):
            acc = _verify(tree, logits, seq)
            if observe is not None:
                observe(tree, logits, acc)
            path = acc.path.to(target.device)
            paths.append(path)
            new = acc.accepted_tokens.tolist() + [acc.next_token]
            emit = []
            for t in new:
                emit.append(t)
                if t in seq.stops or seq.produced + len(emit) >= seq.budget:
                    break
            seq.produced += len(emit)
            seq.finish_reason = "stop" if emit[-1] in seq.stops else "length" if seq.produced >= seq.budget else None
            bonus = sizes[r] > 1 and tree.buffers.leaf[int(acc.path[-1])]
            outputs.append((seq, StepOutput(emit, StepStats(acc.num_accepted, len(emit), sizes[r], bonus, tree.levels),
                                            seq.finish_reason)))
            new_tokens, new_hidden = torch.tensor(new, device=target.device), states.hidden[r][path]
            if drafter is None:  # the head has not seen the pending pairs: they wait for its next draft
                new_tokens = torch.cat([seq.pending_tokens, new_tokens])
                new_hidden = torch.cat([seq.pending_hidden, new_hidden])
            seq.pending_tokens, seq.pending_hidden = new_tokens, new_hidden
            seq.root = acc.next_token
        rows.keep_paths(start, paths)
        if self.report is not None and drafting:  # an all-vanilla step says nothing of the tree
            self.report(seqs, [out for _, out in outputs])
        self.remove([s for s in seqs if s.done])
        return outputs

    def _draft_trees(self, drafter: Drafter | None) -> list[DraftTree]:
        """One drafting pass for all rows; a row too close to its end (no room in the context for a
        tree, or one token left), or one that does not draft (`speculative=False`), verifies its root
        alone: its draft is computed and dropped, which keeps the head's cache in step with the others."""
        seqs = self.sequences
        if drafter is None:
            return [self._root_only(s) for s in seqs]
        noise = {}
        if any(s.reproducible for s in seqs):  # the drafter proposes with the target's noise
            noise["noise"] = [DraftNoise(s.seed, s.position, s.sampling.temperature) if s.reproducible else None
                              for s in seqs]
        trees = drafter.draft_rows(self._draft, [s.pending_tokens for s in seqs],
                                   [s.pending_hidden for s in seqs], [s.root for s in seqs], **noise)
        room = self.target.max_context - drafter.max_nodes
        lens = self._rows.lens.tolist()
        return [tree if s.speculative and lens[r] <= room and s.produced + 1 < s.budget else self._root_only(s, tree.levels)
                for r, (s, tree) in enumerate(zip(seqs, trees))]

    def _root_only(self, seq: Sequence, levels: int | None = None) -> DraftTree:
        """The root alone; levels: the head levels drafted for the row and dropped (None: no draft)."""
        return DraftTree(torch.tensor([seq.root], device=self.target.device), _ROOT_ONLY, levels)


def _choose(logits: torch.Tensor, sampling: SamplingParams, seed: int, generator: torch.Generator, position: int) -> int:
    """The token after the prompt (at `position`), from the target alone. logits: [1, V]."""
    if sampling.greedy:
        return int(greedy_ids(logits[0]))
    if sampling.mode == REPRODUCIBLE:
        return perturbed_argmax(processed_scores(logits[0], sampling.temperature, sampling.top_k, sampling.top_p),
                                seed, position)
    probs = logits_to_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p)
    return int(sample(probs, generator)[0])


def _verify(tree: DraftTree, logits: torch.Tensor, seq: Sequence) -> Acceptance:
    """logits: [N, V] the target's at each node of the tree."""
    b, sampling = tree.buffers, seq.sampling
    if sampling.greedy:
        return verify_greedy(tree.tokens, logits, b.paths)
    if seq.reproducible:
        depth = b.tree_position_ids.tolist()

        def token_at(node: int) -> int:  # node at depth d chooses the token at position + d
            scores = processed_scores(logits[node], sampling.temperature, sampling.top_k, sampling.top_p)
            return perturbed_argmax(scores, seq.seed, seq.position + depth[node])

        return verify_chosen(tree.tokens, token_at, b.parents)

    def probs_at(node: int) -> torch.Tensor:
        return logits_to_probs(logits[node], sampling.temperature, sampling.top_k, sampling.top_p)

    return verify_sampling(tree.tokens, probs_at, b.parents, seq.generator)
