"""The request queue and the one worker thread that runs the generator, batching continuously.

Each job carries a cancel flag, checked between decoding steps: a client that goes away frees its
place in the batch at the next step, and a job cancelled while still queued is skipped. Events go
back to the job's asyncio loop thread-safely. A job that asks for token origins
(serve/origin.py) gets a Delta per step, carrying that step's tokens and their origins.

Requests are tokenized with a copy of the target's tokenizer, under a lock of their own: the
worker detokenizes every step with the original and never waits behind a long prompt.
"""

from __future__ import annotations

import asyncio
import copy
import queue
import threading
import time
from dataclasses import dataclass, field

from ..core.config import SamplingParams
from ..engine.decoding import GenerationResult
from ..engine.prompts import COUNT_CHUNK_CHARS, prompt_text, tokens_at_least
from ..engine.text import TextStream
from .origin import TARGET, TokenSpans, step_origins, step_record


@dataclass(frozen=True)
class Started:
    queue_s: float  # seconds the job waited for the worker


@dataclass(frozen=True)
class Delta:
    text: str
    origin: dict | None = None  # with token_origin: {"tokens": [{i, text, origin}], "steps": [{accepted, ...}]}


@dataclass(frozen=True)
class Done:
    finish_reason: str  # "stop" (end-of-sequence token or stop string), "length", or "cancelled"
    completion_tokens: int
    stats: dict         # speculation statistics, returned in the response's `eaglespec` field


@dataclass(frozen=True)
class Failed:
    message: str


class QueueFull(Exception):
    pass


class PromptTooLong(Exception):
    def __init__(self, tokens: int, limit: int):
        super().__init__(f"the prompt has at least {tokens} tokens, more than {limit}")
        self.tokens, self.limit = tokens, limit


@dataclass
class Job:
    input_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop: list[str]
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.perf_counter)
    speculative: bool = True   # False: decoded without drafts (the request's "eaglespec": {"speculative": false})
    token_origin: bool = False  # report each token's origin and each step (serve/origin.py)
    queued: bool = False  # counted among the engine's waiting jobs (until taken into the batch or cancelled)

    def cancel(self) -> None:
        """Engine.cancel also frees a queued job's place in the queue at once: call that."""
        self.cancelled.set()

    def emit(self, event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass


class Engine:
    """Owns the generator's time: continuous batching over one worker thread.

    Jobs join the running batch at the next step (up to max_batch sequences, in arrival order;
    the rest wait in the queue), each step drafts and verifies every sequence in the batch at
    once, a job's text goes out as its steps finish, and a job leaves the batch when it is done
    or its client has gone (the cancel flag is read before every step)."""

    def __init__(self, generator, max_queue: int = 64, max_batch: int = 1):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.generator = generator
        self.max_queue = max_queue
        self.max_batch = max_batch
        # HF fast tokenizers are not safe to share across threads: the worker decodes with the target's
        # (under tokenizer_lock), requests are encoded with a copy under a lock of its own
        self.tokenizer_lock = threading.Lock()
        tok = generator.target.tokenizer
        self._encoder = copy.deepcopy(tok) if tok is not None else None
        self._encoder_lock = threading.Lock()
        self.speculative = generator.drafter is not None or (generator.head is not None and generator.tree is not None)
        self.running = 0  # sequences in the batch
        self._queue: queue.Queue = queue.Queue()
        self._waiting = 0
        self._count_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="eaglespec-worker", daemon=True)
        self._thread.start()

    # -- called from the event loop ------------------------------------------------------------
    def submit(self, input_ids: list[int], max_tokens: int, sampling: SamplingParams, stop: list[str],
               speculative: bool = True, token_origin: bool = False) -> Job:
        job = Job(input_ids, max_tokens, sampling, stop, asyncio.get_running_loop(), speculative=speculative,
                  token_origin=token_origin)
        with self._count_lock:
            if self._waiting >= self.max_queue:
                raise QueueFull(f"{self._waiting} requests are already waiting")
            self._waiting += 1
            job.queued = True
        self._queue.put(job)
        return job

    def cancel(self, job: Job) -> None:
        """The client went away: the job leaves the batch at the next step, and a job still in the
        queue stops counting against --max-queue now (its entry is skipped when reached), so that
        abandoned requests never refuse new ones."""
        job.cancel()
        self._dequeued(job)

    def _dequeued(self, job: Job) -> None:
        with self._count_lock:
            if job.queued:
                job.queued = False
                self._waiting -= 1

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def busy(self) -> bool:
        return self.running > 0

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def encode(self, messages: list[dict], chat_template: bool = True, limit: int | None = None) -> list[int]:
        """Messages -> ids, as `generator.encode`, with the request side's tokenizer. With `limit`, a
        text longer than one counting chunk is first counted chunk by chunk, and PromptTooLong is
        raised as soon as it is known to exceed `limit` tokens: no more than about `limit` tokens of
        it are ever tokenized (a 4 MB body would take seconds)."""
        with self._encoder_lock:
            tok = self._encoder
            if limit is not None:
                text = prompt_text(tok, messages, chat_template)
                if len(text) > COUNT_CHUNK_CHARS:
                    n = tokens_at_least(tok, text, limit, parse_special=chat_template and bool(tok.chat_template))
                    if n > limit:
                        raise PromptTooLong(n, limit)
            return self.generator.encode(messages=messages, chat_template=chat_template, tokenizer=tok)

    def decode(self, ids: list[int]) -> str:
        with self.tokenizer_lock:
            return self.generator.decode(ids) or ""

    def close(self) -> None:
        self._queue.put(None)

    # -- the worker thread ---------------------------------------------------------------------
    def _run(self) -> None:
        batch = self.generator.new_batch()
        active: dict = {}  # Sequence -> _Running: the jobs in the batch
        while True:
            if not self._admit(batch, active):
                return
            cancelled = [seq for seq, r in active.items() if r.job.cancelled.is_set()]
            for seq in cancelled:
                active.pop(seq).finish("cancelled")
            batch.remove(cancelled)
            self.running = len(batch)
            if not len(batch):
                continue
            try:
                outputs = batch.step()
            except Exception as exc:  # an engine error fails the batch's requests, never the worker
                for r in active.values():
                    r.job.emit(Failed(f"{type(exc).__name__}: {exc}"))
                active.clear()
                batch = self.generator.new_batch()
                self.running = 0
                continue
            for seq, out in outputs:
                reason = active[seq].take(out)
                if reason is not None:
                    active.pop(seq).finish(reason)
                    batch.remove([seq])  # a stop string ends it early; a finished sequence has left already
            self.running = len(batch)

    def _admit(self, batch, active: dict) -> bool:
        """Take waiting jobs into the batch (blocking while it is empty); False at close."""
        while len(batch) < self.max_batch:
            try:
                job = self._queue.get(block=not len(batch))
            except queue.Empty:
                return True
            if job is None:
                return False
            self._dequeued(job)
            if job.cancelled.is_set():
                continue
            job.emit(Started(time.perf_counter() - job.submitted))
            r = _Running(job, TextStream(self.decode, job.stop, token_ends=job.token_origin),
                         self.speculative and job.speculative)
            try:
                seq, first = batch.add(job.input_ids, job.max_tokens, job.sampling, self.generator.eos_token_ids(),
                                       speculative=job.speculative)
            except Exception as exc:
                job.emit(Failed(f"{type(exc).__name__}: {exc}"))
                continue
            reason = r.take(first)
            if reason is not None:
                r.finish(reason)
                batch.remove([seq])
            else:
                active[seq] = r
            self.running = len(batch)
        return True


class _Running:
    """A job in the batch: its text so far and its statistics."""

    def __init__(self, job: Job, text: TextStream, speculative: bool):
        self.job, self.text, self.speculative = job, text, speculative
        self.result = GenerationResult(prompt_tokens=len(job.input_ids))
        self.spans = TokenSpans() if job.token_origin else None
        self.start = time.perf_counter()

    def take(self, out) -> str | None:
        """One step's tokens -> a text delta. Returns the finish reason once the job is done."""
        prefill = not self.result.token_ids  # the first output is the prefill's token, not a step
        self.result.add(out)
        sent = self.text.sent
        delta = self.text.push(out.tokens)
        if self.spans is not None:
            self._mark([TARGET] if prefill else step_origins(out.stats))
            self._send(sent, delta, [] if prefill else [step_record(out.stats)])
        elif delta:
            self.job.emit(Delta(delta))
        if self.text.stopped:
            return "stop"
        return out.finish_reason

    def _mark(self, origins: list[str]) -> None:
        """Where each new token's text ends (TextStream.ends: the length of the text decoded up to
        it; an incomplete UTF-8 character at the end belongs to the token that completes it)."""
        for end, origin in zip(self.text.ends, origins):
            self.spans.add(end, origin)

    def _send(self, sent: int, delta: str, steps: list[dict]) -> None:
        self.job.emit(Delta(delta, {"tokens": self.spans.spans(sent, delta), "steps": steps}))

    def finish(self, reason: str) -> None:
        result = self.result
        result.finish_reason = reason
        if reason != "cancelled":
            sent = self.text.sent
            rest = self.text.flush()
            if rest and self.spans is not None:
                self._send(sent, rest, [])
            elif rest:
                self.job.emit(Delta(rest))
        result.elapsed = time.perf_counter() - self.start
        stats = {
            "target_forwards": result.target_forwards,
            "tau": round(result.tau, 4),
            "accepted_lengths": [s.emitted for s in result.steps],  # bonus included, per verification step
            "accepted_draft_tokens": sum(s.accepted for s in result.steps),
            "speculative": self.speculative,
            "elapsed_s": round(result.elapsed, 4),
            "tokens_per_second": round(result.tokens_per_second, 2),
        }
        self.job.emit(Done(reason, len(result.token_ids), stats))
