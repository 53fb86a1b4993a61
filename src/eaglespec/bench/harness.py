"""Runs every method on every question, interleaved, and checks losslessness while it measures.

For each question (and turn) every method runs once, in an order rotated by one per prompt, so that
machine drift (thermal, other load) spreads over all methods instead of favouring the one that runs
first. Under greedy decoding, and in the reproducible sampling mode with a seed, each lossless method
must emit exactly vanilla's ids: a mismatch is a failure, reported at once and in the result; outside references (HF) only raise a warning, as they
run other kernels. The second MT-bench turn appends vanilla's own first answer to the messages.

A `Journal` keeps every finished prompt on disk, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

from ..core.config import REPRODUCIBLE, SamplingParams
from ..errors import EagleError
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
    matches_vanilla: bool | None  # greedy or seeded reproducible sampling; None for vanilla itself and otherwise


@dataclass
class BenchResult:
    entries: list[Entry]
    failures: list[str]  # lossless methods that differ from vanilla under greedy
    warnings: list[str]  # outside references that differ from vanilla

    @property
    def lossless(self) -> bool:
        return not self.failures


class Journal:
    """progress.jsonl in the output directory: a settings line, then one line per finished prompt
    (every method's entry, failures, warnings), appended and fsynced as each prompt ends. A run
    whose directory holds a journal of the same settings skips the prompts it lists; a journal of
    other settings is refused. A last line torn by an interruption is cut off (that prompt runs
    again)."""

    NAME = "progress.jsonl"

    def __init__(self, out: Path, settings: dict):
        self.path = out / self.NAME
        self.done: dict[tuple[str, int], dict] = {}
        settings = json.loads(json.dumps(settings))  # as it will read back (tuples become lists)
        data = self.path.read_bytes() if self.path.exists() else b""
        whole = data[:data.rfind(b"\n") + 1]  # complete lines only
        if len(whole) < len(data):  # the next line must start on a line of its own
            with open(self.path, "r+b") as f:
                f.truncate(len(whole))
        if whole:
            lines = whole.decode("utf-8").split("\n")[:-1]  # "\n" only: a string may hold U+2028
            found = _json_line(lines[0])
            if found is None or "settings" not in found:
                raise EagleError(f"{self.path} is not a bench journal: delete it or choose another --out")
            if found["settings"] != settings:
                changed = sorted(k for k in set(found["settings"]) | set(settings)
                                 if found["settings"].get(k) != settings.get(k))
                raise EagleError(f"{out} holds a bench run with other settings ({', '.join(changed)} differ): "
                                 "choose another --out, or delete that directory to start again")
            for line in lines[1:]:
                item = _json_line(line)
                if item is not None:
                    self.done[(item["question_id"], item["turn"])] = item
        else:
            out.mkdir(parents=True, exist_ok=True)
            self._append({"settings": settings})

    def get(self, question_id: str, turn: int) -> tuple[list[Entry], list[str], list[str]] | None:
        item = self.done.get((question_id, turn))
        if item is None:
            return None
        entries = [Entry(**{**e, "record": Record(**e["record"])}) for e in item["entries"]]
        return entries, item["failures"], item["warnings"]

    def add(self, question_id: str, turn: int, entries: list[Entry], failures: list[str], warnings: list[str]) -> None:
        self._append({"question_id": question_id, "turn": turn, "entries": [asdict(e) for e in entries],
                      "failures": failures, "warnings": warnings})

    def _append(self, item: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(item) + "\n")
            f.flush()
            os.fsync(f.fileno())


def _json_line(line: str) -> dict | None:
    try:
        item = json.loads(line)
    except json.JSONDecodeError:
        return None
    return item if isinstance(item, dict) else None


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
              warmup: bool = True, progress: bool = True, journal: Journal | None = None) -> BenchResult:
    """encode: chat messages -> prompt ids; decode: ids -> text (for the second turn's history).
    user_text(question, turn index) -> the user message (default: the turn as written).
    methods[0] must be vanilla: the baseline of the speedup and of the equality check.
    journal: prompts it holds are taken from it, and each prompt run is added to it."""
    from tqdm import tqdm

    if not methods or methods[0].name != BASELINE:
        raise ValueError("methods[0] must be the vanilla baseline")
    if len({m.name for m in methods}) != len(methods):
        raise ValueError(f"method names must be unique: {[m.name for m in methods]}")
    user_text = user_text or (lambda q, t: q.turns[t])
    identical = sampling.greedy or (sampling.mode == REPRODUCIBLE and sampling.seed is not None)  # ids must equal vanilla's
    todo = [(q, t) for q in questions for t in range(min(turns, len(q.turns)))]
    if journal is not None and all((q.question_id, t + 1) in journal.done for q, t in todo):
        warmup = False  # nothing left to time
    if warmup and questions:
        ids = encode([{"role": "user", "content": user_text(questions[0], 0)}])
        # first calls pay for allocation, lazy initialisation and kernel selection: not timed
        for method in tqdm(methods, desc="warm-up", unit="method", disable=not progress, file=sys.stderr):
            method.run(ids, min(WARMUP_TOKENS, max_new_tokens), sampling)

    entries: list[Entry] = []
    failures: list[str] = []
    warnings: list[str] = []
    prompt_index = 0
    with tqdm(total=len(todo) * len(methods), desc="bench", unit="run", disable=not progress, file=sys.stderr) as bar:
        for q in questions:
            messages: list[dict] = []
            for t in range(min(turns, len(q.turns))):
                messages.append({"role": "user", "content": user_text(q, t)})
                kept = journal.get(q.question_id, t + 1) if journal is not None else None
                if kept is not None:
                    entries += kept[0]
                    failures += kept[1]
                    warnings += kept[2]
                    vanilla = next(e.record.token_ids for e in kept[0] if e.method == BASELINE)
                    messages.append({"role": "assistant", "content": decode(vanilla)})
                    prompt_index += 1
                    bar.update(len(methods))
                    continue
                ids = encode(messages)
                task_sampling = sampling if sampling.seed is None else replace(sampling, seed=sampling.seed + prompt_index)
                shift = prompt_index % len(methods)
                records: dict[str, tuple[int, Record]] = {}
                for order, method in enumerate(methods[shift:] + methods[:shift]):
                    bar.set_postfix_str(f"q={q.question_id} turn={t + 1} {method.name}")
                    records[method.name] = (order, method.run(ids, max_new_tokens, task_sampling))
                    bar.update()
                vanilla = records[BASELINE][1].token_ids
                found: list[Entry] = []
                failed: list[str] = []
                warned: list[str] = []
                for method in methods:
                    order, record = records[method.name]
                    match = None
                    if identical and method.name != BASELINE:
                        at = first_difference(vanilla, record.token_ids)
                        match = at is None
                        if not match:
                            where = (f"{method.name} differs from vanilla on question {q.question_id} turn {t + 1} at "
                                     f"token {at} ({len(record.token_ids)} vs {len(vanilla)} tokens)")
                            if method.kind == "reference":
                                warned.append(where)
                                _say(f"warning: {where} (outside reference, other kernels)")
                            else:
                                failed.append(where)
                                _say(f"LOSSLESSNESS FAILURE: {where}")
                    found.append(Entry(q.question_id, q.category, t + 1, method.name, order, len(ids), record, match))
                if journal is not None:
                    journal.add(q.question_id, t + 1, found, failed, warned)
                entries += found
                failures += failed
                warnings += warned
                messages.append({"role": "assistant", "content": decode(vanilla)})
                prompt_index += 1
    return BenchResult(entries, failures, warnings)
