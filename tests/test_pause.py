"""Long jobs step aside for benchmarks (eaglespec/pause.py): the hold file, its liveness check, the
PAUSE file, and which commands hold the machine."""

import os
import subprocess
import sys
import time

import pytest

from eaglespec import pause


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLESPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(pause, "POLL_S", 0.05)
    pause.idle()  # a lock another test's job left in this process (on another cache folder)
    yield tmp_path / "cache"
    pause.idle()


def holding_process(cache):
    """Another process that holds the machine until it is killed; returns once it holds it."""
    code = "import time\nfrom eaglespec.pause import hold_machine\nwith hold_machine():\n    print('held', flush=True)\n    time.sleep(60)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "EAGLESPEC_CACHE": str(cache)})
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_live_benchmark_pauses_and_a_dead_one_does_not(cache, tmp_path):
    assert pause.holder() is None and pause.pause_reason(tmp_path) is None
    proc = holding_process(cache)
    try:
        assert pause.holder() == proc.pid
        assert f"pid {proc.pid}" in pause.pause_reason(tmp_path)
    finally:
        proc.kill()
        proc.wait()
    # killed: its file stays behind, but a dead pid pauses nothing
    assert (cache / pause.HOLD_FILE).read_text() == str(proc.pid)
    assert pause.holder() is None and pause.pause_reason(tmp_path) is None


def test_hold_machine_removes_only_its_own_file(cache):
    with pause.hold_machine():
        assert (cache / pause.HOLD_FILE).read_text() == str(os.getpid())
        with pause.hold_machine():  # nested: still the outer hold's
            pass
        assert (cache / pause.HOLD_FILE).is_file()
        assert pause.holder() is None  # a process never waits for itself
    assert not (cache / pause.HOLD_FILE).exists()
    proc = holding_process(cache)
    try:
        with pause.hold_machine():  # a second benchmark leaves the first one's file alone
            pass
        assert pause.holder() == proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_a_reused_pid_pauses_nothing_without_the_lock(cache, tmp_path):
    """A pid file naming a live process that is no benchmark (the pid of a killed one, given to
    another process since) does not pause: the lock decides."""
    other = subprocess.Popen(["sleep", "30"])
    try:
        cache.mkdir(parents=True, exist_ok=True)
        (cache / pause.HOLD_FILE).write_text(str(other.pid))
        assert pause.holder() is None and pause.pause_reason(tmp_path) is None
    finally:
        other.kill()
        other.wait()


def test_overlapping_benchmarks_keep_jobs_paused_until_the_last_ends(cache, tmp_path):
    first, second = holding_process(cache), holding_process(cache)
    try:
        assert pause.holder() == first.pid  # the pid file is the first one's
        first.kill()
        first.wait()
        assert pause.holder() == 0  # the second still holds the lock; its pid is not on file
        assert "benchmark.lock" in pause.pause_reason(tmp_path)
    finally:
        second.kill()
        second.wait()
    assert pause.holder() is None and pause.pause_reason(tmp_path) is None


def test_another_jobs_probe_is_not_a_hold(cache, monkeypatch):
    """A long job tests the lock with a brief exclusive try; another job testing it in the same
    instant must not read that as a benchmark."""
    import fcntl
    import threading

    monkeypatch.setattr(pause, "PROBES", 100)  # 1 s of tries: the probe below lasts 50 ms
    cache.mkdir(parents=True, exist_ok=True)
    fd = os.open(cache / pause.LOCK_FILE, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    threading.Timer(0.05, lambda: os.close(fd)).start()
    assert pause.holder() is None


def test_wait_if_paused_sleeps_until_the_pause_file_goes(tmp_path):
    import threading

    (tmp_path / pause.PAUSE_FILE).touch()
    heard = []
    timer = threading.Timer(0.3, (tmp_path / pause.PAUSE_FILE).unlink)
    timer.start()
    start = time.monotonic()
    waited = pause.wait_if_paused(tmp_path, heard.append)
    assert time.monotonic() - start >= 0.3 and waited >= 0.3
    assert heard[0].startswith("paused: ") and "PAUSE exists" in heard[0] and heard[-1].startswith("resumed after")
    assert pause.wait_if_paused(tmp_path, heard.append) == 0.0


@pytest.mark.parametrize("argv, holds", [
    (["generate", "--prompt", "hi"], True), (["bench"], True), (["tune", "--head", "h"], True), (["bench-modes"], True),
    (["bench-batch"], True),
    (["capture", "--data", "sharegpt", "--out", "x"], False), (["serve"], False)])
def test_timing_commands_hold_the_machine(argv, holds):
    from eaglespec.cli.commands import build_parser

    assert getattr(build_parser().parse_args(argv), "holds_machine", False) is holds


def working_process(cache, unit_s: float, marker):
    """A long job that has begun a unit of work of `unit_s` seconds (it passed wait_if_paused),
    writes `marker` when the unit ends, then checks for a pause again and prints 'resumed'."""
    code = ("import sys, time\nfrom eaglespec import pause\npause.POLL_S = 0.05\npause.wait_if_paused()\n"
            "print('working', flush=True)\ntime.sleep(float(sys.argv[1]))\n"
            "open(sys.argv[2], 'w').write('done')\npause.wait_if_paused()\nprint('resumed', flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(unit_s), str(marker)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "EAGLESPEC_CACHE": str(cache)})
    assert proc.stdout.readline().strip() == "working"
    return proc


def test_a_benchmark_starts_only_once_a_working_job_has_finished_its_step(cache, tmp_path, capsys):
    marker = tmp_path / "unit-done"
    job = working_process(cache, 0.6, marker)
    try:
        with pause.hold_machine():
            assert marker.exists()  # the job's step ended before the benchmark's block began
            assert job.poll() is None  # and the job sleeps at its pause point, not finished
        assert job.stdout.readline().strip() == "resumed"
    finally:
        job.kill()
        job.wait()
    err = capsys.readouterr().err
    assert "waiting for a background job" in err and "paused after" in err


def test_a_job_that_never_comes_back_to_its_pause_check_delays_a_benchmark_only_so_long(cache, tmp_path,
                                                                                          monkeypatch, capsys):
    monkeypatch.setattr(pause, "SETTLE_S", 0.3)
    job = working_process(cache, 60, tmp_path / "never")
    try:
        start = time.monotonic()
        with pause.hold_machine():
            waited = time.monotonic() - start
        assert 0.3 <= waited < 5
        assert "did not pause within" in capsys.readouterr().err
    finally:
        job.kill()
        job.wait()


def test_a_job_that_benchmarks_itself_does_not_wait_for_its_own_step(cache, monkeypatch):
    monkeypatch.setattr(pause, "SETTLE_S", 5)
    assert pause.wait_if_paused() == 0.0  # now working a unit: holds the busy lock
    assert pause._busy_fd is not None
    start = time.monotonic()
    with pause.hold_machine():
        assert time.monotonic() - start < 1
    assert pause._busy_fd is None  # it stepped aside; the next check takes the lock again
    pause.wait_if_paused()
    assert pause._busy_fd is not None
    pause.idle()
    assert pause._busy_fd is None


def test_a_forked_child_does_not_keep_the_jobs_lock(cache, monkeypatch):
    """After fork the child drops its copy of the busy lock: the parent's idle() frees the machine."""
    import fcntl

    pause.wait_if_paused()  # this process works a unit
    ready, told = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child (its fork hooks have run): says so, then sleeps holding what it kept
        os.write(told, b"x")
        time.sleep(1.0)
        os._exit(0)
    try:
        assert os.read(ready, 1) == b"x"
        pause.idle()
        fd = os.open(cache / pause.BUSY_FILE, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free although the child still runs
        finally:
            os.close(fd)
    finally:
        os.waitpid(pid, 0)
