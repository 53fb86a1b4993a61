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
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ..core.config import parse_tree
from ..core.tree import StaticTree, static_tree
from ..core.verify import greedy_ids
from ..draft.drafter import Drafter, scores_context
from ..errors import EagleError, one_line
from ..files import CACHE_ENV, atomic_write_bytes, cache_dir

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
        """The head's acceptance.json, or None when it has none; a damaged one is refused in one line."""
        path = Path(head_dir) / STATS_FILE
        if not path.is_file():
            return None
        fix = f"measure it again with `eaglespec tune --head {path.parent}`, or delete it (--tree auto then uses EAGLE-1's tree)"
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise EagleError(f"{path} cannot be read as JSON ({one_line(exc)}): {fix}") from exc
        try:
            p = tuple(tuple(float(x) for x in row) for row in data["p"])
            steps = int(data["steps"])
        except (KeyError, TypeError, ValueError) as exc:
            raise EagleError(f"{path} is not an acceptance table {{\"p\": [[...], ...], \"steps\": N}} "
                             f"({one_line(exc)}): {fix}") from exc
        if not p or not p[0] or len({len(row) for row in p}) != 1:
            raise EagleError(f"{path}: p must be a non-empty table with one row per depth, all rows as long: {fix}")
        if not all(0.0 <= x <= 1.0 for row in p for x in row):
            raise EagleError(f"{path}: p holds values outside 0..1 (probabilities): {fix}")
        return cls(p, steps)


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
        choice = greedy_ids(logits).tolist()
        parents, tokens = dt.buffers.parents.tolist(), dt.tokens.tolist()
        accepted = set(acc.path.tolist())
        for node in range(1, len(tokens)):
            if parents[node] in accepted:
                d, r = depths[node] - 1, ranks[node]
                trials[d, r] += 1
                hits[d, r] += tokens[node] == choice[parents[node]]

    with gen.whole_trees():  # observe reads each node's rank and depth in the whole tree
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
    """For N = 1..max_nodes: (paths of the N most valuable nodes, expected tau). A node's value is
    its parent's times p at its depth and rank, so it never exceeds its parent's: taking nodes by
    value from a heap that holds the children of every node taken gives the N best, closed under
    parents, whatever order a (noisy) calibration puts the ranks in."""
    p = stats.p
    depth_max, width = len(p), len(p[0])
    heap = [(-p[0][r], (r,)) for r in range(width)]
    heapq.heapify(heap)
    paths, tau, out = [], 1.0, []
    while heap and len(paths) < max_nodes:
        neg, path = heapq.heappop(heap)
        paths.append(path)
        tau += -neg
        out.append((tuple(paths), tau))
        if len(path) < depth_max:  # its children
            for r in range(width):
                heapq.heappush(heap, (neg * p[len(path)][r], path + (r,)))
    return out


NOISE_LIMIT = 0.25  # a cost whose rounds' interquartile range exceeds this share of its median is noisy
NOISE_TRIES = 3     # measurements of a noisy curve before it is kept, flagged
NOISE_FLOOR = 0.02  # seconds: spreads are judged against at least this (steps of a few ms jitter by a ms)
OTHERS_LIMIT = 0.25  # cores: other processes' CPU time during a measurement, over its wall time, above which it
                     # was shared (beyond the cores torch's threads leave idle): a steady job slows every timing
                     # alike, which the spread does not show


def rerank_top_k(nodes: int, depth: int) -> int:
    """The top-k with which one sequence grows --tree auto's tree of `nodes` draft nodes and
    `depth` levels EAGLE-2 style (Drafter's rerank): 2 up to 8 nodes, the CPU trees, where a wider
    frontier measured no better (docs/benchmarks.md, "EAGLE-2 growth for the tuned trees"), then
    about the square root, so that a GPU-sized tree of 60 nodes expands 7 a level, near EAGLE-2's
    own 8-10 (not measured here); raised where k a level could not hold the tree's nodes (k + k^2
    (depth - 1) candidates: a shallow, wide tree)."""
    k = max(2, math.isqrt(nodes)) if nodes > 8 else 2
    while k + k * k * (depth - 1) < nodes:
        k += 1
    return k


COST_REPS = 15  # paired rounds of a cost curve: at 5, six curves in one process put the 4-token verification at
                # 0.97-1.16x a vanilla step (sd 0.076); at 15, 0.99-1.08x (sd 0.031), ~6 s a curve (session 42)


@torch.no_grad()
def measure_step_costs(gen, trees: dict[int, StaticTree], context: int = 256, reps: int = COST_REPS,
                       batch: int = 1) -> tuple[float, dict[int, tuple[float, float]], float]:
    """-> (vanilla step seconds, {N: (draft seconds, verify seconds)}, noise) for `batch` sequences
    of `context` cached tokens each, through the batched step's own code (the target's backend:
    start_rows, verify_rows; the head's), so a compiled target is measured compiled.

    Paired against vanilla: in each of `reps` rounds every draft and verify cost is timed in a
    shuffled order, each right after a vanilla step of its own, and kept as its ratio to that
    step; a cost is the median of its ratios times the median vanilla step. A shared machine's
    speed wanders from second to second (on the AVX-512 kind a vanilla step measured 12-18 ms
    minutes apart while a 4-token step stayed at 15-17), and what the tree choice needs is the
    ratio: two steps a few ms apart see the same machine. noise is the largest interquartile range
    / median of the vanilla steps and of any cost (its ratios times the vanilla step; a median under
    NOISE_FLOOR counts as NOISE_FLOOR; one stray round is not noise)."""
    import random
    import statistics

    target = gen.target
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, target.vocab_size, (1, context), generator=g)
    cache = target.new_cache()
    layers = gen.head.hidden_layers
    features = target.forward_states(prompt.expand(batch, -1), cache, layers=layers).hidden[0]  # what the head reads
    rows = target.start_rows(cache, [context] * batch, context + max([1, *(t.num_nodes for t in trees.values())]))

    def verify(tree: StaticTree | None):
        n = 1 if tree is None else tree.num_nodes
        tokens = torch.randint(0, target.vocab_size, (batch, n), generator=g)
        mask = torch.ones(1, 1, dtype=torch.bool) if tree is None else tree.buffers.tree_mask
        depth = torch.zeros(1, dtype=torch.long) if tree is None else tree.buffers.tree_position_ids
        target.verify_rows(tokens, rows, mask.expand(batch, n, n), depth.expand(batch, n), [n] * batch, layers)
        rows.crop(context)

    def drafting(tree: StaticTree):  # one sequence grows it EAGLE-2 style, as it will decode
        drafter = Drafter(gen.head, target, tree, gen.draft_vocab, rerank=rerank_top_k(tree.num_nodes - 1, tree.depth) if batch == 1 else 0,
                          context_vocab=gen.context_vocab, lm=gen.draft_lm())
        state = drafter.new_state(batch)
        # the head's cache: context - 2 pairs per row
        drafter.draft_rows(state, [prompt[0, 1:-1]] * batch, [features[:-2]] * batch, [int(prompt[0, -2])] * batch)

        def draft():
            drafter.draft_rows(state, [prompt[0, -1:]] * batch, [features[-2:-1]] * batch, [int(prompt[0, -1])] * batch)
            state.rows.crop(context - 2)
        return draft

    def timed(fn) -> float:
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    vanilla = lambda: verify(None)  # noqa: E731
    cases = {}
    for n, tree in trees.items():
        cases[("draft", n)] = drafting(tree)
        cases[("verify", n)] = lambda tree=tree: verify(tree)
    for fn in (vanilla, *cases.values()):  # warm: first calls allocate (and build compiled graphs)
        fn()
    steps: list[float] = []
    ratios = {case: [] for case in cases}
    order = list(cases)
    shuffle = random.Random(0).shuffle
    for _ in range(max(reps, 1)):
        shuffle(order)
        for case in order:
            steps.append(timed(vanilla))
            ratios[case].append(timed(cases[case]) / steps[-1])
    step = statistics.median(steps)
    ratio = {case: statistics.median(rs) for case, rs in ratios.items()}
    noise = max([_noise(steps, step)] + [_noise([r * step for r in rs], ratio[case] * step)  # costs in seconds
                                         for case, rs in ratios.items()])
    return step, {n: (ratio[("draft", n)] * step, ratio[("verify", n)] * step) for n in trees}, noise


# -- the cost curve, cached per machine ---------------------------------------------------------
RETUNE_ENV = "EAGLESPEC_RETUNE"   # 1: measure the cost curve again, as --retune
COST_SCHEME = 6                   # bump when what measure_step_costs times changes (3: the draft LM head compiled;
                                  # 4: costs paired with an adjacent vanilla step; 5: one sequence's
                                  # drafting grown EAGLE-2 style, rerank_top_k); 6: 15 rounds, not 5
COST_CONTEXT = 256                # tokens in the cache a cost is measured on


def retune_requested() -> bool:
    import os

    return os.environ.get(RETUNE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _head_architecture(gen) -> str:
    """What a draft step's cost depends on: the kind, every parameter's shape, the draft
    vocabulary's size and the head's dtype where it is not the target's; not the weights' values
    (a retrained head costs the same per step)."""
    import hashlib

    h = hashlib.sha256(gen.head.kind.encode())
    for name, param in sorted(gen.head.state_dict().items()):
        h.update(f"{name}:{tuple(param.shape)};".encode())
    h.update(f"draft_vocab:{None if gen.draft_vocab is None else gen.draft_vocab.numel()}".encode())
    if scores_context(gen.head, gen.draft_vocab, gen.context_vocab):
        h.update(b"context")  # the context tokens' rows: a little more work a level
    if gen.draft_dtype != gen.target.dtype:  # a head run in its own dtype (use_draft_dtype) drafts at its own speed
        h.update(f"dtype:{gen.draft_dtype}".encode())
    return f"{gen.head.kind}-{h.hexdigest()[:16]}"


def cost_key(gen) -> dict:
    """Everything a measured step cost depends on: the machine (CPU model and matrix flags, or the
    GPU), the software, the thread count, the target's weights and dtype, the decoding step's
    kernels (target.steps.kernels), and the head's shape."""
    import transformers

    from .. import __version__
    from .target import cpu_identity

    target = gen.target
    device = target.device
    return {"scheme": COST_SCHEME, **cpu_identity(), "device": str(device),
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "transformers": transformers.__version__, "eaglespec": __version__,
            "target": target.fingerprint(), "dtype": str(target.dtype).removeprefix("torch."), "quantization": target.quantization,
            "steps": target.steps.kernels,
            "head": _head_architecture(gen), "context": COST_CONTEXT}


def cost_file(key: dict, folder: Path | None = None) -> Path:
    import hashlib

    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return (folder or cache_dir()) / f"step-costs-{digest}.json"


@dataclass(frozen=True)
class CostCurve:
    """Seconds of one step on this machine, for one batch size."""

    vanilla: float                         # one vanilla step: a single-token target forward
    costs: dict[int, tuple[float, float]]  # N -> (draft s, verify s) of the N-node tree measured
    source: str                            # where the figures came from, said to the user


def _read_costs(path: Path, key: dict, trees: dict[int, StaticTree], batch: int = 1) -> tuple[dict | None, CostCurve | None]:
    """-> (the file's contents, the curve when it covers these very trees); raises ValueError
    (or KeyError / TypeError) for a file that is not ours or is damaged."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("batch_sizes"), dict):
        raise ValueError("no batch_sizes table")
    if data.get("key") != key:  # a hash collision or an older scheme: measure, and overwrite
        return None, None
    entry = data["batch_sizes"].get(str(batch))
    if entry is None:
        return data, None
    rows = entry["trees"]
    if any(str(n) not in rows or rows[str(n)]["paths"] != [list(p) for p in tree.paths] for n, tree in trees.items()):
        return data, None  # other trees (new acceptance, other sizes): measure these
    costs = {n: (float(rows[str(n)]["draft"]), float(rows[str(n)]["verify"])) for n in trees}
    vanilla = float(entry["vanilla"])
    if not all(x > 0 for x in (vanilla, *(c for pair in costs.values() for c in pair))):
        raise ValueError("a cost is not a positive number of seconds")
    source = (f"cost curve cached at {path} (measured {entry['measured_at']}, {key['threads']} threads); "
              f"--retune or {RETUNE_ENV}=1 measures it again"
              f"{_noise_note(float(entry.get('noise', 0.0)), float(entry.get('others', 0.0)))}")
    return data, CostCurve(vanilla, costs, source)


def step_costs(gen, trees: dict[int, StaticTree], reps: int = COST_REPS, cache: Path | None = None,
               retune: bool = False, batch: int = 1) -> CostCurve:
    """The cost curve of `trees` on this machine: read from `cache` (a folder; see `cost_key` for
    what the file is keyed by) when it holds these trees and retune is off, else measured
    (`measure_step_costs`) and written there. cache None: always measured, nothing written. A
    damaged cache file is ignored, said so, and rewritten; an unwritable folder only costs the
    next start a measurement. batch: sequences decoding together (each batch size has its entry)."""
    from datetime import datetime

    if cache is None:
        vanilla, costs, noise, others = _quietest(gen, trees, reps, batch)
        return CostCurve(vanilla, costs, f"cost curve measured now (not cached){_noise_note(noise, others)}")
    key = cost_key(gen)
    path = cost_file(key, cache)
    data, note = None, ""
    if path.is_file():
        try:
            data, curve = _read_costs(path, key, trees, batch)
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
            data, curve = None, None
            note = f"note: ignored the damaged cost cache {path} ({one_line(exc)}); "
        if curve is not None and not retune:
            return curve
    start = time.perf_counter()
    vanilla, costs, noise, others = _quietest(gen, trees, reps, batch)
    took = time.perf_counter() - start
    entry = {"measured_at": datetime.now().astimezone().isoformat(timespec="seconds"), "reps": reps,
             "noise": round(noise, 4), "others": round(others, 4), "vanilla": vanilla,
             "trees": {str(n): {"paths": [list(p) for p in tree.paths], "draft": costs[n][0], "verify": costs[n][1]}
                       for n, tree in trees.items()}}
    # other batch sizes' entries (measured by their own code) stay as they were
    sizes = {**(data or {}).get("batch_sizes", {}), str(batch): entry}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, json.dumps({"key": key, "batch_sizes": sizes}, indent=1).encode())
        where = f"cached at {path}; --retune or {RETUNE_ENV}=1 measures it again"
    except OSError as exc:
        where = f"not cached: {path.parent} is not writable ({exc.strerror}); set {CACHE_ENV} to a writable folder"
    return CostCurve(vanilla, costs, f"{note}cost curve measured now in {took:.0f} s, {where}{_noise_note(noise, others)}")


def _noise(times: list[float], median: float) -> float:
    """Interquartile range / median of some timings (seconds); a median under NOISE_FLOOR counts as
    NOISE_FLOOR, and fewer than two timings are no noise."""
    if len(times) < 2:
        return 0.0
    import statistics

    q1, _, q3 = statistics.quantiles(times, n=4)
    return (q3 - q1) / max(median, NOISE_FLOOR)


def _busy_seconds(line: str, tick: float) -> float:
    """/proc/stat's aggregate `cpu` line -> seconds every CPU has been busy: user, nice, system,
    irq, softirq and steal (other virtual machines); not idle or iowait, and not guest, which user
    and nice already hold."""
    fields = line.split()
    if not fields or fields[0] != "cpu":
        raise ValueError(f"not /proc/stat's cpu line: {line[:40]!r}")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / tick


def _cpu_seconds() -> tuple[float, float] | None:
    """(CPU seconds every process on the machine has run, this process's own: its threads and the
    children it has waited for, such as a compiler), or None where the kernel does not say (no
    /proc/stat: not Linux)."""
    import os

    try:
        with open("/proc/stat") as f:
            busy = _busy_seconds(f.readline(), os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError):
        return None
    own = os.times()
    return busy, own.user + own.system + own.children_user + own.children_system


def _others(before, after, seconds: float, spare: int = 0) -> float:
    """Cores' worth of CPU time that other processes (and other virtual machines: steal) ran
    between two _cpu_seconds readings `seconds` apart, beyond `spare` cores (the ones this
    process's threads leave idle, where other work does not take their turns); 0 where not known."""
    if before is None or after is None or seconds <= 0:
        return 0.0
    return max((after[0] - before[0]) - (after[1] - before[1]) - spare * seconds, 0.0) / seconds


def _quietest(gen, trees, reps: int, batch: int):
    """measure_step_costs, again while it is noisy or shared (NOISE_TRIES in all): -> (vanilla,
    costs, noise, others) of the quietest one, the one least over its limits. Shared: other
    processes ran more than OTHERS_LIMIT cores meanwhile, beyond the cores torch's threads leave
    idle (a job beside it, running through the measurement, slows every timing alike: the spread
    stays small while the ratios may shift)."""
    import os

    from ..pause import hold_machine

    spare = max((os.cpu_count() or 1) - torch.get_num_threads(), 0)
    best = None
    with hold_machine():  # a capture or training run in the background sleeps meanwhile
        for _ in range(NOISE_TRIES):
            before, start = _cpu_seconds(), time.perf_counter()
            vanilla, costs, noise = measure_step_costs(gen, trees, context=COST_CONTEXT, reps=reps, batch=batch)
            got = (vanilla, costs, noise, _others(before, _cpu_seconds(), time.perf_counter() - start, spare))
            if best is None or _overshoot(got) < _overshoot(best):
                best = got
            if _overshoot(best) <= 1.0:
                break
    return best


def _overshoot(measured) -> float:
    """How far a measurement (vanilla, costs, noise, others) is over its limits: at most 1 within both."""
    return max(measured[2] / NOISE_LIMIT, measured[3] / OTHERS_LIMIT)


def _noise_note(noise: float, others: float = 0.0) -> str:
    notes = []
    if noise > NOISE_LIMIT:
        notes.append(f"the cost curve is noisy (a cost's interquartile range is {noise:.0%} of its median, over "
                     f"{NOISE_TRIES} measurements)")
    if others > OTHERS_LIMIT:
        notes.append(f"other processes ran {others:.1f} cores' worth of CPU time while the cost curve was measured "
                     f"(the quietest of {NOISE_TRIES} measurements)")
    if not notes:
        return ""
    return (f"\nnote: {'; '.join(notes)}: other work is sharing this machine; the tree may not be the best "
            f"one. --retune on a quieter machine measures it again")


@dataclass(frozen=True)
class BatchChoice:
    batch: int                  # sequences decoding together
    tree: StaticTree | None     # None: no drafts at this batch size (vanilla steps are faster)
    predicted_speedup: float    # of the best tree measured at this size


@dataclass(frozen=True)
class TunedTree:
    tree: StaticTree
    predicted_tau: float
    predicted_speedup: float
    table: list[tuple[int, float, float, float, float]]  # (N, tau, draft s, verify s, predicted speedup)
    vanilla: float  # seconds of one vanilla step
    costs_source: str = ""  # where the cost curve came from (cache file, measured now)
    by_batch: tuple[BatchChoice, ...] = ()  # the choices for batches of more than one sequence
    trees: tuple[tuple[int, StaticTree], ...] = ()  # (N, tree) of every row of the table

    def tree_for(self, batch: int) -> StaticTree | None:
        """The tree for a step of `batch` sequences: that of the largest batch size tuned that is
        not above it."""
        tree = self.tree
        for choice in self.by_batch:
            if choice.batch <= batch:
                tree = choice.tree
        return tree

    @property
    def floor(self) -> float:
        """The confidence floor the tuned trees draft with (draft/drafter.py): one more level of
        drafts pays when the chance that it is accepted, read from the draft's own probabilities,
        exceeds what the level costs in tokens at the speed being earned, its drafting time over a
        vanilla step's times the predicted speedup (the verification of a few more tokens costs
        little on the compiled curve, and is left out). At most FLOOR_MAX."""
        return min(FLOOR_MAX, self.level_cost / self.vanilla * max(self.predicted_speedup, 1.0))

    @property
    def level_cost(self) -> float:
        """Seconds of one level of the tuned tree's drafting (its drafting time over its depth)."""
        n = self.tree.num_nodes - 1
        return next(row[2] for row in self.table if row[0] == n) / max(self.tree.depth, 1)

    def describe(self, floor: float | None = None, rerank: int | None = None) -> str:
        """What was chosen and why: two lines, more for batches and when drafting is predicted to lose.
        floor: the confidence floor in use when not the tuned one (--draft-floor); rerank: the
        top-k of a lone sequence's EAGLE-2 growth when not `rerank_top_k`'s (0: the static shape)."""
        floor = self.floor if floor is None else floor
        paths = [list(p) for p in self.tree.paths]
        n = self.tree.num_nodes - 1
        rerank = rerank_top_k(n, self.tree.depth) if rerank is None else rerank
        draft, verify = next((row[2], row[3]) for row in self.table if row[0] == n)
        if rerank:
            how = (f"one sequence grows it EAGLE-2 style (dynamic:{rerank},{self.tree.depth},{n}: each step verifies "
                   f"the {n} nodes the draft is surest of)" + (f", and a level with no node the draft gives {floor:.2f} "
                                                              "or more is not drafted" if floor > 0 else ""))
        else:
            how = (f"nodes the draft gives less than {floor:.2f} are not verified" if floor > 0
                   else "the whole tree every step (--draft-floor 0)")
        text = (f"auto tree: {n} draft nodes, depth {self.tree.depth}, predicted tau {self.predicted_tau:.2f} (at the head's "
                "calibrated acceptance: a prompt's own differs, and the adaptive policy follows it) for a step "
                f"costing {(draft + verify) / self.vanilla:.2f}x a vanilla step: predicted speedup "
                f"{self.predicted_speedup:.2f}x; paths {paths}; {how}")
        if self.by_batch:
            text += "\nauto tree by batch size: " + ", ".join(
                f"{c.batch}: {'no drafts' if c.tree is None else f'{c.tree.num_nodes - 1} nodes'} "
                f"(best predicted {c.predicted_speedup:.2f}x)" for c in self.by_batch)
        if self.costs_source:
            text += f"\n{self.costs_source}"
        if self.predicted_speedup < 1.0:
            text += ("\nnote: even the best tree is predicted to be slower than vanilla decoding on this machine "
                     "with this head (its acceptance is too low for the verify cost); --head none decodes without drafting")
        return text


BATCH_SIZES = (1, 2, 4, 8, 16)
FLOOR_MAX = 0.5  # the tuned confidence floor's cap: above it a tree would rarely draft past depth 1


# vanilla steps before the first probe: 16 since 2026-12-05 (64 before; docs/benchmarks.md, "The
# adaptive tree's first probe"). With 64, make run's prompt left the tree after one weak window and
# never came back; measured side by side (16k head, Zen 4): make run's prompt 1.10x against 0.98x,
# the task set 1.32x against 1.27x; replayed on traces, MT-bench unchanged and a head that never
# pays 0.3-0.4% slower (its probes), still within 2.2% of vanilla.
PROBE_EVERY = 16


class AdaptiveTree:
    """--tree auto while decoding alone: keep the tuned tree while it pays, move to a smaller tree
    or to no drafts when it does not, and back when it does.

    The ladder is the tuned table: for each tree size its predicted tau and its measured step cost
    (the cost curve), and vanilla decoding (tau 1, one vanilla step). Every `window` steps the
    tau observed with the current tree, over all its steps since it was taken, rescales every
    size's predicted acceptance (tau - 1 times observed / predicted, the head being as much better
    or worse than calibrated on this text at every size), and the size with the best predicted
    tokens per second, tau / cost, is taken (vanilla included). Speed is judged from the cost
    curve, not from the clock: wall time over a few steps on a shared machine is noisier than the
    differences being judged. At vanilla no acceptance is seen, so after `probe_every` vanilla
    steps the smallest tree is tried again for a window; a probe that ends back at vanilla doubles
    the wait before the next one (up to `max_probe_every`), and one that keeps a tree resets it.
    A short window (8 steps) and the backoff bound what a head that does not pay on this text
    costs: about one window at the tuned tree, then one window per probe, ever rarer. Batches of
    more than one sequence keep the per-batch-size choice."""

    def __init__(self, ladder: list[tuple[object, float, float]], vanilla: float, start: int,
                 window: int = 8, probe_every: int = PROBE_EVERY, max_probe_every: int = 512, level_cost: float = 0.0):
        """ladder: (tree or None, predicted tau, step seconds), None = vanilla; start: its index;
        level_cost: seconds of one level of drafting (`step_cost` of a step that verified its root alone)."""
        if window < 1 or probe_every < 1 or max_probe_every < probe_every:
            raise ValueError(f"window {window} and probe_every {probe_every} must be >= 1, max_probe_every "
                             f"{max_probe_every} >= probe_every")
        self.ladder, self.vanilla, self.level, self.start = ladder, vanilla, start, start
        self.window, self.probe_every, self.max_probe_every = window, probe_every, max_probe_every
        self.probe_wait = probe_every  # vanilla steps before the next probe
        self.probing = False           # the current window is a probe from vanilla
        self.steps = self.emitted = 0
        self.history: list[int] = [start]  # the levels taken, in order (said by tests and bench)
        self.level_cost = level_cost  # seconds of one level of drafting (from_tuned: the tuned tree's)

    @classmethod
    def from_tuned(cls, tuned: "TunedTree", **kwargs) -> "AdaptiveTree":
        trees = dict(tuned.trees)
        ladder = [(None, 1.0, tuned.vanilla)]
        for n, tau, draft, verify, _ in sorted(tuned.table):
            ladder.append((trees.get(n), tau, draft + verify))
        start = next((i for i, row in enumerate(ladder) if row[0] is tuned.tree), None)
        if start is None or any(tree is None for tree, *_ in ladder[1:]):
            raise EagleError("the adaptive tree needs the tuned tree of every size in its table "
                             "(TunedTree.trees): tune it with tuning.tune, not by hand")
        return cls(ladder, tuned.vanilla, start, level_cost=tuned.level_cost, **kwargs)

    @property
    def tree(self):
        return self.ladder[self.level][0]

    def step_cost(self, verified: int, levels: int | None = None) -> float | None:
        """The predicted seconds of a step of the current tree that verified `verified` tokens (root
        included) after drafting `levels` levels (a confidence floor stops the drafting early; None:
        unknown, read from the width as a static tree's floor cuts it): the cheapest tree of the
        ladder that verifies at least as many, less the levels it drafts and this step did not, or
        a vanilla step and the levels drafted (one when unknown) when only the root is verified.
        None: the current rung's own cost (the whole tree drafted and verified, or a vanilla step
        at vanilla). (A generation's last step, cut at its stop or budget, is not observed:
        decoding.new_batch.)"""
        tree, _, full = self.ladder[self.level]
        if tree is None or verified >= tree.num_nodes and (levels is None or levels >= tree.depth):
            return None
        if verified <= 1:  # a static tree's root alone: its first level drafted, unless said otherwise
            return self.vanilla + self.level_cost * max(levels or 1, 1)
        # the smallest tree of the ladder that verifies as many (its verification width, or wider),
        # less its levels this step did not draft (a grown tree verifies its N best of fewer levels)
        fits = [(t.num_nodes, t.depth, cost) for t, _, cost in self.ladder
                if t is not None and verified <= t.num_nodes <= tree.num_nodes]
        if not fits:
            return None
        _, depth, cost = min(fits)
        return cost - self.level_cost * max(depth - (depth if levels is None else levels), 0)

    def reset(self) -> None:
        """Start afresh for another text (a server's next request in the same batch): the tuned
        tree, no evidence, the first probe's wait."""
        self._move(self.start)
        self.steps = self.emitted = 0
        self.probe_wait, self.probing = self.probe_every, False

    def _move(self, level: int) -> None:
        if level != self.level:  # staying keeps the evidence: a tree is judged on all its steps so far
            self.level = level
            self.history.append(level)
            self.steps = self.emitted = 0

    def observe(self, emitted: int, cost: float | None = None) -> None:
        """One step of a lone sequence that emitted `emitted` tokens with the current tree. cost:
        the step's predicted seconds when it verified less than the whole tree (a confidence
        floor): the tree is then judged at the speed it earns, its tokens counted at the whole
        tree's cost."""
        self.steps += 1
        tree, tau_predicted, full = self.ladder[self.level]
        self.emitted += emitted if cost is None or tree is None else emitted * full / cost
        if tree is None:
            if self.steps >= self.probe_wait:
                self.probing = True
                self._move(1)  # the smallest tree (from_tuned sorts the ladder: vanilla, then by size)
            return
        if self.steps % self.window:
            return
        scale = (self.emitted / self.steps - 1.0) / max(tau_predicted - 1.0, 1e-9)
        speeds = [(1.0 + (tau - 1.0) * scale) / cost for _, tau, cost in self.ladder]
        best = max(range(len(speeds)), key=lambda i: (speeds[i], -i))
        if self.probing:  # a failed probe waits twice as long for the next; a kept tree resets the wait
            self.probe_wait = min(2 * self.probe_wait, self.max_probe_every) if best == 0 else self.probe_every
            self.probing = False
        self._move(best)


def tune(gen, stats: AcceptanceStats, sizes=SIZES, reps: int = COST_REPS, cache: Path | None = None,
         retune: bool = False, max_batch: int = 1) -> TunedTree:
    """The tree of `sizes` nodes with the best predicted tokens/s; cache and retune: see `step_costs`.

    max_batch > 1 also tunes batches of 2, 4, 8, 16 sequences up to it. A larger batch keeps the
    target's matrix units busier, so a vanilla step gets cheaper per token and verifying a tree
    relatively dearer (the EAGLE paper's batch-size study): each batch size is measured only
    with trees no larger than the previous size's choice, and gets no drafts at all where none
    is predicted to pay."""
    if gen.head is None:
        raise EagleError("tree auto-tuning needs an EAGLE head")
    candidates = best_trees(stats, max(sizes))
    trees = {n: static_tree(candidates[n - 1][0]) for n in sizes if n <= len(candidates)}
    choices, sources = [], []
    best_n, tuned = max(trees), None
    for batch in (b for b in BATCH_SIZES if b <= max_batch):
        sized = {n: t for n, t in trees.items() if n <= best_n}
        curve = step_costs(gen, sized, reps, cache, retune, batch)
        table = []
        for n in sized:
            tau, (draft, verify) = candidates[n - 1][1], curve.costs[n]
            table.append((n, tau, draft, verify, tau * curve.vanilla / (draft + verify)))
        best = max(table, key=lambda row: row[4])
        if batch == 1:
            tuned = TunedTree(trees[best[0]], best[1], best[4], table, curve.vanilla, curve.source)
        else:
            choices.append(BatchChoice(batch, trees[best[0]] if best[4] > 1.0 else None, best[4]))
            sources.append(curve.source)
        if best[4] <= 1.0 and batch > 1:
            break  # larger batches pay even less for drafts
        best_n = best[0]
    source = tuned.costs_source if not sources else f"{tuned.costs_source} (batch 1; {len(sources)} more batch sizes likewise)"
    return TunedTree(tuned.tree, tuned.predicted_tau, tuned.predicted_speedup, tuned.table, tuned.vanilla, source,
                     tuple(choices), tuple((n, trees[n]) for n, *_ in tuned.table))


def use_auto_tree(gen, retune: bool = False, max_batch: int = 1, max_tokens: int | None = None) -> None:
    """Give `gen` the tree tuned for this machine from its head directory's acceptance.json and
    the cached cost curve (gen.tuned says what was chosen and why); EAGLE-1's tree, with a note,
    when the head has none. retune (or EAGLESPEC_RETUNE=1): measure the cost curve again."""
    stats = AcceptanceStats.load(gen.head_dir) if gen.head_dir is not None and gen.head is not None else None
    dtype = str(gen.target.dtype).removeprefix("torch.")
    eagle1 = parse_tree("eagle1")
    if stats is None and (max_tokens is None or eagle1.num_nodes + 1 <= max_tokens):
        note = "--tree auto: the head has no acceptance.json (run `eaglespec tune`), using EAGLE-1's tree"
        gen.head_note = f"{gen.head_note}; {note}" if gen.head_note else note
        gen.tree, gen.tuned = eagle1, None
        return
    allowed = SIZES if max_tokens is None else tuple(n for n in SIZES if n + 1 <= max_tokens)
    sizes = gen.target.steps.tree_sizes(allowed)
    if stats is None or not sizes:  # not even one draft node (or, untuned, EAGLE-1's tree) verifies exactly
        what = "no tree verifies" if not sizes else "the head has no acceptance.json and EAGLE-1's tree does not verify"
        note = (f"--tree auto: in {dtype} on the {gen.target.steps.name} kernels {what} exactly on this machine "
                "(numerics.py), so no drafts; --allow-inexact accepts rounding-level differences")
        gen.head_note = f"{gen.head_note}; {note}" if gen.head_note else note
        gen.tree, gen.tuned = None, None
        return
    gen.tuned = tune(gen, stats, sizes=sizes, cache=cache_dir(), retune=retune or retune_requested(),
                     max_batch=max_batch)
    if max_tokens is not None and max(allowed) < max(SIZES):
        gen.tuned = replace(gen.tuned, costs_source=f"{gen.tuned.costs_source}\ntrees up to {max(sizes)} draft nodes: "
                            f"larger ones do not verify exactly in {dtype} here "
                            "(--allow-inexact lifts this)")
    gen.tree = gen.tuned.tree
