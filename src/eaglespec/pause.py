"""Long jobs step aside while a benchmark runs.

A capture or a training run takes hours at low priority; a benchmark takes minutes and needs both
cores and the memory bandwidth to itself (on a 2-core CPU a niced job's OpenMP threads still get
scheduled, and a decoding step is bound by the bandwidth both share). So:
- a benchmark holds the machine (`hold_machine`): it writes its pid into `<cache>/benchmark.pid`
  and removes it when it ends;
- a long job calls `wait_if_paused` between units of work (a conversation, an optimiser step) and
  sleeps while a live process holds the machine, or while a `PAUSE` file sits in its own output
  folder (`touch runs/capture/PAUSE` pauses it by hand, `rm` resumes it).
A pid file left by a killed benchmark pauses nothing: the pid must be alive.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path

from .files import atomic_write_bytes, cache_dir

PAUSE_FILE = "PAUSE"          # in a long job's output folder: pause it by hand
HOLD_FILE = "benchmark.pid"   # in the cache folder: the pid of the benchmark that holds the machine
POLL_S = 2.0


def _hold_path() -> Path:
    return cache_dir() / HOLD_FILE


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _recorded_pid() -> int | None:
    try:
        return int(_hold_path().read_text().strip() or 0) or None
    except (OSError, ValueError):
        return None


def holder() -> int | None:
    """The pid of the live process that holds the machine for a benchmark, or None."""
    pid = _recorded_pid()
    return pid if pid is not None and pid > 0 and pid != os.getpid() and _alive(pid) else None


@contextlib.contextmanager
def hold_machine():
    """Hold the machine for the block: long jobs that call `wait_if_paused` sleep until it ends.
    Nested holds (and a second benchmark while one runs) keep the first holder's file."""
    path = _hold_path()
    mine = False
    try:
        if holder() is None and _recorded_pid() != os.getpid():
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(path, str(os.getpid()).encode())
            mine = True
    except OSError:  # a read-only cache: benchmarks still run, unprotected
        mine = False
    try:
        yield
    finally:
        if mine and _recorded_pid() == os.getpid():
            with contextlib.suppress(OSError):
                path.unlink()


def pause_reason(folder: str | os.PathLike | None = None) -> str | None:
    """Why a long job writing into `folder` should wait now, or None."""
    if folder is not None and (Path(folder) / PAUSE_FILE).exists():
        return f"{Path(folder) / PAUSE_FILE} exists (remove it to resume)"
    pid = holder()
    if pid is not None:
        return f"a benchmark (pid {pid}) holds the machine"
    return None


def wait_if_paused(folder: str | os.PathLike | None = None, report: Callable[[str], None] | None = None,
                   poll_s: float | None = None) -> float:
    """Sleep while `pause_reason(folder)` says so; `report` hears each new reason and the resume.
    Returns the seconds waited (a time-limited job does not count them)."""
    reason = pause_reason(folder)
    if reason is None:
        return 0.0
    start = time.monotonic()
    told = None
    while reason is not None:
        if reason != told and report is not None:
            report(f"paused: {reason}")
        told = reason
        time.sleep(POLL_S if poll_s is None else poll_s)
        reason = pause_reason(folder)
    waited = time.monotonic() - start
    if report is not None:
        report(f"resumed after {waited:.0f} s")
    return waited
