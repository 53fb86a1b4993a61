"""Tree auto-tuning: pick the static tree that maximises expected tokens per second on this
machine, for this head.

Two measurements feed a simple model (Medusa / Sequoia style):
  * acceptance: p[d][r] = P(the rank-r draft child at depth d+1 is the target's token | its parent
    was accepted), counted under greedy decoding with a wide calibration tree (`calibrate`);
  * cost: the wall time of one step (draft the tree + verify it) for trees of several sizes,
    measured on the machine at hand (`measure_step_costs`), and of one vanilla step.
The value of a node is the product of p along its path, so the expected tau of a tree is
1 + the sum of its node values, and the best tree of N nodes is the N most valuable nodes
(values only fall along a path). We choose N maximising tau(N) / cost(N), and say so when even
that is predicted to lose to a vanilla step.
"""

from __future__ import annotations

import heapq
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import parse_tree
from .draft.drafter import Drafter
from .errors import EagleError
from .files import atomic_write_bytes
from .tree import StaticTree, static_tree

STATS_FILE = "acceptance.json"
CALIBRATION_DEPTH = 6
CALIBRATION_WIDTH = 6
SIZES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64)


def calibration_tree(depth: int = CALIBRATION_DEPTH, width: int = CALIBRATION_WIDTH) -> StaticTree:
    """A rank-0 spine of `depth` nodes with `width` ranked children at every level."""
    return static_tree([(0,) * d + (r,) for d in range(depth) for r in range(width)])


@dataclass(frozen=True)
class AcceptanceStats:
    p: tuple[tuple[float, ...], ...]  # p[d][r] for depth d+1, rank r
    steps: int                        # verification steps counted

    def save(self, head_dir: str | Path) -> Path:
        path = Path(head_dir) / STATS_FILE
        atomic_write_bytes(path, json.dumps({"p": self.p, "steps": self.steps}, indent=1).encode())
        return path

    @classmethod
    def load(cls, head_dir: str | Path) -> "AcceptanceStats | None":
        path = Path(head_dir) / STATS_FILE
        if not path.is_file():
            return None
        data = json.loads(path.read_text())
        return cls(tuple(tuple(float(x) for x in row) for row in data["p"]), int(data["steps"]))


def calibrate(gen, prompts: list[list[int]], max_new_tokens: int = 128, stop_token_ids: set[int] | None = None) -> AcceptanceStats:
    """Greedy generation with the calibration tree; counts, for every child whose parent was
    accepted, whether it was the target's token."""
    tree = calibration_tree()
    ranks, depths = tree.ranks.tolist(), tree.depths.tolist()
    hits = torch.zeros(CALIBRATION_DEPTH, CALIBRATION_WIDTH)
    trials = torch.zeros(CALIBRATION_DEPTH, CALIBRATION_WIDTH)
    steps = 0

    def observe(dt, logits, acc):
        nonlocal steps
        steps += 1
        choice = logits.argmax(-1).tolist()
        parents, tokens = dt.buffers.parents.tolist(), dt.tokens.tolist()
        accepted = set(acc.path.tolist())
        for node in range(1, len(tokens)):
            if parents[node] in accepted:
                d, r = depths[node] - 1, ranks[node]
                trials[d, r] += 1
                hits[d, r] += tokens[node] == choice[parents[node]]

    for ids in prompts:
        for _ in gen.stream(ids, max_new_tokens, tree=tree, stop_token_ids=stop_token_ids, observe=observe):
            pass
    # unseen cells (deep levels rarely reached) borrow the level above, discounted
    p = hits / trials.clamp(min=1)
    for d in range(1, CALIBRATION_DEPTH):
        thin = trials[d] < 5
        p[d, thin] = p[d - 1, thin] * 0.9
    return AcceptanceStats(tuple(tuple(round(float(x), 4) for x in row) for row in p), steps)


def best_trees(stats: AcceptanceStats, max_nodes: int = max(SIZES)) -> list[tuple[tuple[tuple[int, ...], ...], float]]:
    """For N = 1..max_nodes: (paths of the N most valuable nodes, expected tau)."""
    p = stats.p
    depth_max, width = len(p), len(p[0])
    heap = [(-p[0][0], (0,))]
    paths, tau, out = [], 1.0, []
    while heap and len(paths) < max_nodes:
        neg, path = heapq.heappop(heap)
        paths.append(path)
        tau += -neg
        out.append((tuple(paths), tau))
        d, r = len(path) - 1, path[-1]
        if r + 1 < width:  # next sibling
            heapq.heappush(heap, (neg / max(p[d][r], 1e-9) * p[d][r + 1], path[:-1] + (r + 1,)))
        if d + 1 < depth_max:  # first child
            heapq.heappush(heap, (neg * p[d + 1][0], path + (0,)))
    return out


def _timed(fn, reps: int) -> float:
    fn()  # warm
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


@torch.no_grad()
def measure_step_costs(gen, trees: dict[int, StaticTree], context: int = 256,
                       reps: int = 3) -> tuple[float, dict[int, tuple[float, float]]]:
    """-> (vanilla step seconds, {N: (draft seconds, verify seconds)}) on a cache of `context` tokens."""
    from .kv_cache import crop

    target = gen.target
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, target.vocab_size, (1, context), generator=g)
    cache = target.new_cache()
    layers = gen.head.hidden_layers
    features = target.forward_states(prompt, cache, layers=layers).hidden[0]  # what the head reads
    base = cache.get_seq_length()

    def verify(tree: StaticTree | None):
        n = 1 if tree is None else tree.num_nodes
        tokens = torch.randint(0, target.vocab_size, (1, n), generator=g)
        mask = torch.ones(1, 1, dtype=torch.bool) if tree is None else tree.buffers.tree_mask
        depth = torch.zeros(1, dtype=torch.long) if tree is None else tree.buffers.tree_position_ids
        target.logits(target.forward_states(tokens, cache, mask, depth, layers if tree is not None else None).features)
        crop(cache, base)

    vanilla = _timed(lambda: verify(None), reps)
    costs = {}
    for n, tree in trees.items():
        drafter = Drafter(gen.head, target, tree, gen.draft_vocab)
        state = drafter.new_state()
        drafter.draft(state, prompt[0, 1:-1], features[:-2], int(prompt[0, -2]))  # the head's cache: context - 2 pairs

        def draft():
            drafter.draft(state, prompt[0, -1:], features[-2:-1], int(prompt[0, -1]))
            crop(state.cache, context - 2)

        costs[n] = (_timed(draft, reps), _timed(lambda: verify(tree), reps))
    return vanilla, costs


@dataclass(frozen=True)
class TunedTree:
    tree: StaticTree
    predicted_tau: float
    predicted_speedup: float
    table: list[tuple[int, float, float, float, float]]  # (N, tau, draft s, verify s, predicted speedup)
    vanilla: float  # seconds of one vanilla step

    def describe(self) -> str:
        paths = [list(p) for p in self.tree.paths]
        text = (f"auto tree: {self.tree.num_nodes - 1} draft nodes, depth {self.tree.depth}, predicted tau "
                f"{self.predicted_tau:.2f}, predicted speedup {self.predicted_speedup:.2f}x; paths {paths}")
        if self.predicted_speedup < 1.0:
            text += ("\nnote: even the best tree is predicted to be slower than vanilla decoding on this machine "
                     "with this head (its acceptance is too low for the verify cost); --head none decodes without drafting")
        return text


def tune(gen, stats: AcceptanceStats, sizes=SIZES, reps: int = 3) -> TunedTree:
    if gen.head is None:
        raise EagleError("tree auto-tuning needs an EAGLE head")
    candidates = best_trees(stats, max(sizes))
    trees = {n: static_tree(candidates[n - 1][0]) for n in sizes if n <= len(candidates)}
    vanilla, costs = measure_step_costs(gen, trees, reps=reps)
    table = []
    for n in trees:
        tau, (draft, verify) = candidates[n - 1][1], costs[n]
        table.append((n, tau, draft, verify, tau * vanilla / (draft + verify)))
    best = max(table, key=lambda row: row[4])
    return TunedTree(trees[best[0]], best[1], best[4], table, vanilla)


def use_auto_tree(gen) -> None:
    """Give `gen` the tree tuned for this machine from its head directory's acceptance.json
    (gen.tuned says what was chosen); EAGLE-1's tree, with a note, when the head has none."""
    stats = AcceptanceStats.load(gen.head_dir) if gen.head_dir is not None and gen.head is not None else None
    if stats is None:
        note = "--tree auto: the head has no acceptance.json (run `eaglespec tune`), using EAGLE-1's tree"
        gen.head_note = f"{gen.head_note}; {note}" if gen.head_note else note
        gen.tree, gen.tuned = parse_tree("eagle1"), None
        return
    gen.tuned = tune(gen, stats)
    gen.tree = gen.tuned.tree
