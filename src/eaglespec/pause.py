"""Long jobs step aside while a benchmark runs.

A capture or a training run takes hours at low priority; a benchmark takes minutes and needs both
cores and the memory bandwidth to itself (on a 2-core CPU a niced job's OpenMP threads still get
scheduled, and a decoding step is bound by the bandwidth both share). So:
- a benchmark holds the machine (`hold_machine`): it holds a shared flock on
  `<cache>/benchmark.lock` for as long as it runs (several benchmarks may hold it at once; the
  kernel drops a killed one's lock), and writes its pid into `<cache>/benchmark.pid` to be named
  in messages;
- a long job calls `wait_if_paused` between units of work (a conversation, an optimiser step) and
  sleeps while another process holds the lock, or while a `PAUSE` file sits in its own output
  folder (`touch runs/capture/PAUSE` pauses it by hand, `rm` resumes it).
The lock, not the pid file, decides: a pid file left by a killed benchmark, or naming a pid the
system has since given to another process, pauses nothing, and the second of two overlapping
benchmarks keeps jobs paused after the first one ends. (Jobs started by an older eaglespec read
the pid file alone: it is still written.)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path

from .files import atomic_write_bytes, cache_dir

PAUSE_FILE = "PAUSE"          # in a long job's output folder: pause it by hand
HOLD_FILE = "benchmark.pid"   # in the cache folder: the pid of a benchmark that holds the machine (messages)
LOCK_FILE = "benchmark.lock"  # in the cache folder: share-locked by every running benchmark
POLL_S = 2.0
PROBES = 5                    # lock tries 10 ms apart before a job counts the machine as held
_holds = 0                    # hold_machine blocks open in this process: it never waits for itself


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


def _held_elsewhere() -> bool:
    """Whether another process holds the machine: its shared lock keeps our exclusive try out."""
    if _holds:
        return False
    try:
        fd = os.open(cache_dir() / LOCK_FILE, os.O_RDONLY)
    except OSError:  # no lock file: no benchmark has run here
        return False
    try:
        for _ in range(PROBES):  # another long job's probe holds it for microseconds: try again
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                time.sleep(0.01)
                continue
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        return True
    finally:
        os.close(fd)


def holder() -> int | None:
    """None when no other process holds the machine for a benchmark; else the pid its file names
    (0 when that is unknown: the file is gone, or names a process that has ended)."""
    if not _held_elsewhere():
        return None
    pid = _recorded_pid()
    return pid if pid is not None and pid > 0 and pid != os.getpid() and _alive(pid) else 0


@contextlib.contextmanager
def hold_machine():
    """Hold the machine for the block: long jobs that call `wait_if_paused` sleep until it ends.
    Nested holds and overlapping benchmarks each hold the lock; the pid file is the first one's."""
    global _holds
    path = _hold_path()
    fd, mine = None, False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path.parent / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
        except PermissionError:  # a read-only cache whose lock file exists: a read-only descriptor locks too
            fd = os.open(path.parent / LOCK_FILE, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_SH)
        pid = _recorded_pid()
        if pid is None or (pid != os.getpid() and not _alive(pid)):
            atomic_write_bytes(path, str(os.getpid()).encode())
            mine = True
    except OSError:  # a read-only cache: benchmarks still run, unprotected
        pass
    _holds += 1
    try:
        yield
    finally:
        _holds -= 1
        if mine and _recorded_pid() == os.getpid():
            with contextlib.suppress(OSError):
                path.unlink()
        if fd is not None:
            os.close(fd)  # drops the lock


def pause_reason(folder: str | os.PathLike | None = None) -> str | None:
    """Why a long job writing into `folder` should wait now, or None."""
    if folder is not None and (Path(folder) / PAUSE_FILE).exists():
        return f"{Path(folder) / PAUSE_FILE} exists (remove it to resume)"
    pid = holder()
    if pid is not None:
        return f"a benchmark ({f'pid {pid}' if pid else cache_dir() / LOCK_FILE}) holds the machine"
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
