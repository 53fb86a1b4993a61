"""Helpers for the server tests: a live uvicorn server on a free 127.0.0.1 port, in a thread,
and a generator wrapper that slows every step (to hold the worker busy on purpose)."""

from __future__ import annotations

import time

import pytest
import torch

from eaglespec.serve.loadtest import serve_in_thread


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """The tiny models are fastest on one thread; two threads on a shared 2-core CI box thrash."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def live_server(app):
    """A live uvicorn server on a free 127.0.0.1 port, in a thread; yields its base URL."""
    return serve_in_thread(app)


class SlowGenerator:
    """Delegates to a generator; its batches sleep `delay` seconds per step, and nothing stops at
    end-of-sequence."""

    def __init__(self, gen, delay: float):
        self._gen, self.delay = gen, delay

    def __getattr__(self, name):
        return getattr(self._gen, name)

    def eos_token_ids(self) -> set[int]:
        return set()

    def new_batch(self, *args, **kwargs) -> "SlowBatch":
        return SlowBatch(self._gen.new_batch(*args, **kwargs), self.delay)


class SlowBatch:
    def __init__(self, batch, delay: float):
        self._batch, self.delay = batch, delay

    def __getattr__(self, name):
        return getattr(self._batch, name)

    def __len__(self) -> int:
        return len(self._batch)

    def step(self, *args, **kwargs):
        time.sleep(self.delay)
        return self._batch.step(*args, **kwargs)
