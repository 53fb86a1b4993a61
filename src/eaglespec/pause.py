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
  folder (`touch runs/capture/PAUSE` pauses it by hand, `rm` resumes it);
- a job that is not paused holds a shared flock on `<cache>/jobs.lock` from one `wait_if_paused`
  to the next (one unit of work), and a benchmark takes that lock exclusively once before it
  starts: it waits until every such job has finished the unit in hand, up to SETTLE_S. Without
  this the first seconds of a benchmark (a training step of EAGLE-3 takes ~3 s) ran beside the
  job it had just paused, and a 16-second roofline measurement read 0.70 instead of 0.76.
The lock, not the pid file, decides: a pid file left by a killed benchmark, or naming a pid the
system has since given to another process, pauses nothing, and the second of two overlapping
benchmarks keeps jobs paused after the first one ends. (Jobs started by an older eaglespec read
the pid file alone: it is still written.)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from .files import atomic_write_bytes, cache_dir

PAUSE_FILE = "PAUSE"          # in a long job's output folder: pause it by hand
HOLD_FILE = "benchmark.pid"   # in the cache folder: the pid of a benchmark that holds the machine (messages)
LOCK_FILE = "benchmark.lock"  # in the cache folder: share-locked by every running benchmark
BUSY_FILE = "jobs.lock"       # in the cache folder: share-locked by each long job while it works a unit
SETTLE_S = 30.0               # how long a benchmark waits for working jobs to reach their pause point
POLL_S = 2.0
PROBES = 5                    # lock tries 10 ms apart before a job counts the machine as held
_holds = 0                    # hold_machine blocks open in this process: it never waits for itself
_busy_fd: int | None = None   # this process's shared lock on BUSY_FILE while it works a unit


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


def _lock_fd(name: str) -> int:
    """A descriptor of `<cache>/name` to flock (created if need be; read-only where it must be)."""
    path = cache_dir() / name
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:  # a read-only cache whose lock file exists: a read-only descriptor locks too
        return os.open(path, os.O_RDONLY)


def _work() -> None:
    """Mark this process as working a unit (shared lock on BUSY_FILE), if it is not already."""
    global _busy_fd
    if _busy_fd is not None:
        return
    try:
        fd = _lock_fd(BUSY_FILE)
    except OSError:  # a read-only cache: the job runs unmarked, benchmarks do not wait for it
        return
    fcntl.flock(fd, fcntl.LOCK_SH)  # blocks only for the instant a benchmark tests the lock
    _busy_fd = fd


def idle() -> None:
    """This process does no pausable work for now (it is paused, done, or about to run a phase
    that never checks `wait_if_paused`): a benchmark need not wait for it."""
    global _busy_fd
    if _busy_fd is not None:
        os.close(_busy_fd)  # drops the lock
        _busy_fd = None


# a forked child shares the parent's lock on BUSY_FILE: it closes its copy, which leaves the parent's
os.register_at_fork(after_in_child=idle)


def _settle(report: Callable[[str], None]) -> None:
    """Wait, up to SETTLE_S, until no job is in the middle of a unit of work: each one finishes
    its step, sees the benchmark lock at its next `wait_if_paused` and sleeps without the busy
    lock. A job that does not get there in time (a phase without pause checks) is said and left."""
    idle()  # this process's own job, if it has one, is the one that measures now
    try:
        fd = _lock_fd(BUSY_FILE)
    except OSError:
        return
    start = time.monotonic()
    told = False
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() - start > SETTLE_S:
                    report(f"[eaglespec] a background job did not pause within {SETTLE_S:.0f} s; measuring beside it")
                    return
                if not told:
                    report("[eaglespec] waiting for a background job to finish its step and pause ...")
                    told = True
                time.sleep(0.05)
                continue
            fcntl.flock(fd, fcntl.LOCK_UN)
            if told:
                report(f"[eaglespec] background jobs paused after {time.monotonic() - start:.1f} s")
            return
    finally:
        os.close(fd)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@contextlib.contextmanager
def hold_machine():
    """Hold the machine for the block: long jobs that call `wait_if_paused` sleep until it ends.
    Nested holds and overlapping benchmarks each hold the lock; the pid file is the first one's."""
    global _holds
    path = _hold_path()
    fd, mine = None, False
    try:
        fd = _lock_fd(LOCK_FILE)
        fcntl.flock(fd, fcntl.LOCK_SH)
        pid = _recorded_pid()
        if pid is None or (pid != os.getpid() and not _alive(pid)):
            atomic_write_bytes(path, str(os.getpid()).encode())
            mine = True
    except OSError:  # a read-only cache: benchmarks still run, unprotected
        pass
    settle = _holds == 0 and fd is not None
    _holds += 1
    try:
        if settle:  # inside the try: an interrupt while it waits still drops the lock
            _settle(_stderr)
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
    Returns the seconds waited (a time-limited job does not count them). The caller counts as
    working (benchmarks wait for it to come back here) from its return to the next call."""
    _work()  # before the check: a benchmark that starts after it waits for this unit to end
    reason = pause_reason(folder)
    if reason is None:
        return 0.0
    idle()
    start = time.monotonic()
    told = None
    while reason is not None:
        if reason != told and report is not None:
            report(f"paused: {reason}")
        told = reason
        time.sleep(POLL_S if poll_s is None else poll_s)
        _work()  # as above: marked working before the look
        reason = pause_reason(folder)
        if reason is not None:
            idle()
    waited = time.monotonic() - start
    if report is not None:
        report(f"resumed after {waited:.0f} s")
    return waited
