"""PURE metric functions over records: no torch, no timing, no I/O.

Symbols as in EAGLE (Li et al., ICML 2024), Figs. 1 and 7:
    tau      average acceptance length: tokens a verification step emits, the bonus (or recovered)
             token included; pooled over every verification step of a method (the prefill token is
             not a step). tau = sum(emitted) / steps.
    n-alpha  acceptance rate at depth n: P(draft token n accepted | draft tokens 1..n-1 accepted),
             estimated from per-step accepted lengths a: #{a >= n} / #{a >= n-1}. With a tree, the
             target may pick any branch, so this is the rate along the accepted path.
    speedup  (tokens / time of the method) / (tokens / time of vanilla). Under greedy decoding every
             lossless method emits exactly vanilla's tokens, so this is total vanilla time / total
             method time for the same tokens. Tokens are counted from generated ids, identically for
             every method.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable


@dataclass
class Record:
    """One method's run on one prompt."""

    token_ids: list[int]               # generated ids (the prompt excluded)
    elapsed: float                     # seconds, prefill included
    accepted: list[int] | None = None  # per verification step: draft tokens accepted (None: method reports no steps)
    emitted: list[int] | None = None   # per verification step: tokens emitted (accepted + 1, cut at a stop)
    tree_sizes: list[int] | None = None  # per verification step: tokens the target verified


def tau(emitted: Iterable[int]) -> float | None:
    """Mean tokens per verification step; None without steps."""
    emitted = list(emitted)
    return sum(emitted) / len(emitted) if emitted else None


def acceptance_histogram(accepted: Iterable[int]) -> list[int]:
    """counts[k] = steps that accepted exactly k draft tokens."""
    accepted = list(accepted)
    counts = [0] * (max(accepted) + 1 if accepted else 0)
    for a in accepted:
        counts[a] += 1
    return counts


def n_alpha(accepted: Iterable[int], max_n: int) -> list[float | None]:
    """[1-alpha, ..., max_n-alpha]; an entry is None when no step reached depth n-1."""
    accepted = list(accepted)
    rates: list[float | None] = []
    for n in range(1, max_n + 1):
        reached = sum(1 for a in accepted if a >= n - 1)
        rates.append(sum(1 for a in accepted if a >= n) / reached if reached else None)
    return rates


def tokens_per_second(tokens: int, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else 0.0


def speedup(tokens: int, seconds: float, vanilla_tokens: int, vanilla_seconds: float) -> float | None:
    """Throughput over vanilla's; equals vanilla_seconds / seconds when the tokens are the same."""
    base = tokens_per_second(vanilla_tokens, vanilla_seconds)
    return tokens_per_second(tokens, seconds) / base if base > 0 else None



@dataclass(frozen=True)
class PairedSpeedup:
    """A method against vanilla over rounds that each ran both, one right after the other."""

    tokens_per_second: float          # the method's, median over rounds
    vanilla_tokens_per_second: float  # vanilla's, median over rounds
    speedup: float                    # median of the rounds' own speedups
    low: float                        # the smallest and largest round speedup
    high: float


def paired_speedup(rounds: list[tuple[float, float]]) -> PairedSpeedup:
    """rounds: (method tokens/s, vanilla tokens/s) of runs made back to back. On a machine whose
    speed wanders (shared cores, a host's memory bandwidth), the ratio within a round is what the
    method changes; a ratio of two separate runs' figures also carries the drift between them."""
    from statistics import median

    if not rounds or any(v <= 0 for _, v in rounds):
        raise ValueError("paired_speedup needs rounds with a positive vanilla rate")
    ratios = [m / v for m, v in rounds]
    return PairedSpeedup(median(m for m, _ in rounds), median(v for _, v in rounds), median(ratios),
                         min(ratios), max(ratios))

def _totals(records: list[Record]) -> tuple[int, float]:
    return sum(len(r.token_ids) for r in records), sum(r.elapsed for r in records)


def summarize(runs: list[tuple[str, str, Record]], baseline: str, max_depth: dict[str, int] | None = None) -> dict:
    """runs: (method, category, record) triples. -> {method: {tokens, seconds, tokens_per_s, speedup,
    tau, steps, histogram, n_alpha, speedup_by_category}}, methods in first-seen order.
    max_depth: per method, the deepest draft level (n-alpha is reported up to it)."""
    max_depth = max_depth or {}
    methods = list(dict.fromkeys(m for m, _, _ in runs))
    categories = list(dict.fromkeys(c for _, c, _ in runs))
    by = {(m, c): [r for m2, c2, r in runs if m2 == m and c2 == c] for m in methods for c in categories}
    base_all = _totals([r for m, _, r in runs if m == baseline])
    out = {}
    for m in methods:
        records = [r for m2, _, r in runs if m2 == m]
        tokens, seconds = _totals(records)
        has_steps = all(r.accepted is not None for r in records)
        accepted = [a for r in records for a in (r.accepted or [])]
        emitted = [e for r in records for e in (r.emitted or [])]
        hist = acceptance_histogram(accepted) if has_steps else None
        depth = max_depth.get(m, len(hist) - 1 if hist else 0)
        per_category = {}
        for c in categories:
            base_c = _totals(by[(baseline, c)])
            if by[(m, c)]:
                per_category[c] = speedup(*_totals(by[(m, c)]), *base_c)
        out[m] = {
            "tokens": tokens,
            "seconds": seconds,
            "tokens_per_s": tokens_per_second(tokens, seconds),
            "speedup": speedup(tokens, seconds, *base_all),
            "tau": tau(emitted) if has_steps else None,
            "steps": len(emitted) if has_steps else None,
            "histogram": hist,
            "n_alpha": n_alpha(accepted, depth) if has_steps and depth > 0 else None,
            "speedup_by_category": per_category,
        }
    return out
