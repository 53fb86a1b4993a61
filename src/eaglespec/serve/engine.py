"""The request queue and the one worker thread that runs the generator (batch size 1).

Each job carries a cancel flag, checked between decoding steps: a client that goes away frees the
worker at the next step, and a job cancelled while still queued is skipped. Events go back to the
job's asyncio loop thread-safely.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field

from ..config import SamplingParams
from ..decoding import GenerationResult
from ..text import TextStream


@dataclass(frozen=True)
class Started:
    queue_s: float  # seconds the job waited for the worker


@dataclass(frozen=True)
class Delta:
    text: str


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

    def cancel(self) -> None:
        self.cancelled.set()

    def emit(self, event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass


class Engine:
    """Owns the generator's time: one job at a time, in arrival order."""

    def __init__(self, generator, max_queue: int = 64):
        self.generator = generator
        self.max_queue = max_queue
        self.tokenizer_lock = threading.Lock()  # HF fast tokenizers are not safe to share across threads
        self.busy = False
        self.speculative = generator.drafter is not None or (generator.head is not None and generator.tree is not None)
        self._queue: queue.Queue = queue.Queue()
        self._waiting = 0
        self._count_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="eaglespec-worker", daemon=True)
        self._thread.start()

    # -- called from the event loop ------------------------------------------------------------
    def submit(self, input_ids: list[int], max_tokens: int, sampling: SamplingParams, stop: list[str]) -> Job:
        with self._count_lock:
            if self._waiting >= self.max_queue:
                raise QueueFull(f"{self._waiting} requests are already waiting")
            self._waiting += 1
        job = Job(input_ids, max_tokens, sampling, stop, asyncio.get_running_loop())
        self._queue.put(job)
        return job

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def encode(self, **kwargs) -> list[int]:
        with self.tokenizer_lock:
            return self.generator.encode(**kwargs)

    def decode(self, ids: list[int]) -> str:
        with self.tokenizer_lock:
            return self.generator.decode(ids) or ""

    def close(self) -> None:
        self._queue.put(None)

    # -- the worker thread ---------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            with self._count_lock:
                self._waiting -= 1
            if job.cancelled.is_set():
                continue
            self.busy = True
            try:
                self._serve(job)
            except Exception as exc:  # an engine error must fail the request, never the worker
                job.emit(Failed(f"{type(exc).__name__}: {exc}"))
            finally:
                self.busy = False

    def _serve(self, job: Job) -> None:
        job.emit(Started(time.perf_counter() - job.submitted))
        text = TextStream(self.decode, job.stop)
        result = GenerationResult(prompt_tokens=len(job.input_ids))
        start = time.perf_counter()
        steps = self.generator.stream(job.input_ids, job.max_tokens, job.sampling)
        try:
            for step in steps:
                if job.cancelled.is_set():
                    result.finish_reason = "cancelled"
                    break
                result.add(step)
                delta = text.push(step.tokens)
                if delta:
                    job.emit(Delta(delta))
                if text.stopped:
                    result.finish_reason = "stop"
                    break
        finally:
            steps.close()
        if result.finish_reason != "cancelled":
            rest = text.flush()
            if rest:
                job.emit(Delta(rest))
        result.elapsed = time.perf_counter() - start
        stats = {
            "target_forwards": result.target_forwards,
            "tau": round(result.tau, 4),
            "accepted_lengths": [s.emitted for s in result.steps],  # bonus included, per verification step
            "accepted_draft_tokens": sum(s.accepted for s in result.steps),
            "speculative": self.speculative,
            "elapsed_s": round(result.elapsed, 4),
            "tokens_per_second": round(result.tokens_per_second, 2),
        }
        job.emit(Done(result.finish_reason, len(result.token_ids), stats))
