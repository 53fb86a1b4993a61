"""Helpers for the server tests: a live uvicorn server on a free 127.0.0.1 port, in a thread,
and a generator wrapper that slows every step (to hold the worker busy on purpose)."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """The tiny models are fastest on one thread; two threads on a shared 2-core CI box thrash."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@contextmanager
def live_server(app):
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


class SlowGenerator:
    """Delegates to a generator; sleeps `delay` seconds per step and never stops at end-of-sequence."""

    def __init__(self, gen, delay: float):
        self._gen, self.delay = gen, delay

    def __getattr__(self, name):
        return getattr(self._gen, name)

    def eos_token_ids(self) -> set[int]:
        return set()

    def stream(self, input_ids, max_new_tokens, sampling, *args, **kwargs):
        kwargs["stop_token_ids"] = set()
        for step in self._gen.stream(input_ids, max_new_tokens, sampling, **kwargs):
            time.sleep(self.delay)
            yield step
