"""Peak resident memory of a process on this machine: what capture's manifest records per shard
and what the server load test reports (docs/serving.md, "Peak memory")."""

from __future__ import annotations

from pathlib import Path

from .errors import EagleError


def peak_rss_mb(pid: int | None = None) -> int:
    """Peak resident memory in MB of this process (pid None) or of process `pid` on this machine
    (Linux: /proc/<pid>/status, VmHWM; since the process started or since `reset_peak_rss`)."""
    try:
        status = Path(f"/proc/{'self' if pid is None else pid}/status").read_text()
    except OSError as exc:
        if pid is None:  # no /proc: getrusage's peak, since the start
            import resource

            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024  # Linux reports KiB
        raise EagleError(f"cannot read the peak memory of process {pid} (/proc/{pid}/status: {exc.strerror})") from exc
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
    raise EagleError(f"/proc/{pid or 'self'}/status has no VmHWM line (not Linux?)")


def reset_peak_rss(pid: int | None = None) -> bool:
    """Start the peak (VmHWM) afresh from the present resident memory, so that it measures the load
    and not start-up (compiling builds graphs in memory); -> False where Linux does not allow it."""
    try:
        with open(f"/proc/{'self' if pid is None else pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False
