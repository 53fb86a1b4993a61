"""Runs every method on every question, interleaved, and checks losslessness while it measures.

For each question (and turn) every method runs once, in an order rotated by one per prompt, so that
machine drift (thermal, other load) spreads over all methods instead of favouring the one that runs
first. Under greedy decoding each lossless method must emit exactly vanilla's ids: a mismatch is a
failure, reported at once and in the result; outside references (HF) only raise a warning, as they
run other kernels. The second MT-bench turn appends vanilla's own first answer to the messages.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from typing import Callable

from ..config import SamplingParams
from .datasets import Question
from .methods import BASELINE, Method
from .metrics import Record

WARMUP_TOKENS = 16


@dataclass
class Entry:
    question_id: str
    category: str
    turn: int                     # 1-based
    method: str
    order: int                    # position of the method in this prompt's rotation (0 = ran first)
    prompt_tokens: int
    record: Record
    matches_vanilla: bool | None  # greedy only; None for vanilla itself and at temperature > 0


@dataclass
class BenchResult:
    entries: list[Entry]
    failures: list[str]  # lossless methods that differ from vanilla under greedy
    warnings: list[str]  # outside references that differ from vanilla

    @property
    def lossless(self) -> bool:
        return not self.failures


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (a length difference counts); None when equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _say(message: str) -> None:
    from tqdm import tqdm

    tqdm.write(message, file=sys.stderr)


def run_bench(questions: list[Question], methods: list[Method], encode: Callable[[list[dict]], list[int]],
              decode: Callable[[list[int]], str], *, max_new_tokens: int, sampling: SamplingParams = SamplingParams(),
              turns: int = 1, user_text: Callable[[Question, int], str] | None = None,
              warmup: bool = True, progress: bool = True) -> BenchResult:
    """encode: chat messages -> prompt ids; decode: ids -> text (for the second turn's history).
    user_text(question, turn index) -> the user message (default: the turn as written).
    methods[0] must be vanilla: the baseline of the speedup and of the equality check."""
    from tqdm import tqdm

    if not methods or methods[0].name != BASELINE:
        raise ValueError("methods[0] must be the vanilla baseline")
    if len({m.name for m in methods}) != len(methods):
        raise ValueError(f"method names must be unique: {[m.name for m in methods]}")
    user_text = user_text or (lambda q, t: q.turns[t])
    if warmup and questions:
        ids = encode([{"role": "user", "content": user_text(questions[0], 0)}])
        # first calls pay for allocation, lazy initialisation and kernel selection: not timed
        for method in tqdm(methods, desc="warm-up", unit="method", disable=not progress, file=sys.stderr):
            method.run(ids, min(WARMUP_TOKENS, max_new_tokens), sampling)

    total = sum(min(turns, len(q.turns)) for q in questions) * len(methods)
    entries: list[Entry] = []
    failures: list[str] = []
    warnings: list[str] = []
    prompt_index = 0
    with tqdm(total=total, desc="bench", unit="run", disable=not progress, file=sys.stderr) as bar:
        for q in questions:
            messages: list[dict] = []
            for t in range(min(turns, len(q.turns))):
                messages.append({"role": "user", "content": user_text(q, t)})
                ids = encode(messages)
                task_sampling = sampling if sampling.seed is None else replace(sampling, seed=sampling.seed + prompt_index)
                shift = prompt_index % len(methods)
                records: dict[str, tuple[int, Record]] = {}
                for order, method in enumerate(methods[shift:] + methods[:shift]):
                    bar.set_postfix_str(f"q={q.question_id} turn={t + 1} {method.name}")
                    records[method.name] = (order, method.run(ids, max_new_tokens, task_sampling))
                    bar.update()
                vanilla = records[BASELINE][1].token_ids
                for method in methods:
                    order, record = records[method.name]
                    match = None
                    if sampling.greedy and method.name != BASELINE:
                        at = first_difference(vanilla, record.token_ids)
                        match = at is None
                        if not match:
                            where = (f"{method.name} differs from vanilla on question {q.question_id} turn {t + 1} at "
                                     f"token {at} ({len(record.token_ids)} vs {len(vanilla)} tokens)")
                            if method.kind == "reference":
                                warnings.append(where)
                                _say(f"warning: {where} (outside reference, other kernels)")
                            else:
                                failures.append(where)
                                _say(f"LOSSLESSNESS FAILURE: {where}")
                    entries.append(Entry(q.question_id, q.category, t + 1, method.name, order, len(ids), record, match))
                messages.append({"role": "assistant", "content": decode(vanilla)})
                prompt_index += 1
    return BenchResult(entries, failures, warnings)
