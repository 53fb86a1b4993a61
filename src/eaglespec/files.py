"""Atomic file replacement for capture shards, manifests, checkpoints and metrics: a reader sees
the old file or the new one, never a part. And the one folder where eaglespec keeps what it
measures or builds on this machine (`cache_dir`)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


CACHE_ENV = "EAGLESPEC_CACHE"  # a folder for measured facts and builds of this machine (default: the user's cache)


def cache_dir() -> Path:
    """$EAGLESPEC_CACHE, else $XDG_CACHE_HOME/eaglespec, else ~/.cache/eaglespec: cost curves and
    numerics reports (engine/tuning.py, numerics.py), compiled steps (compiled.py), llama.cpp's
    build (interop/build_llamacpp.py)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "eaglespec"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: Path):
    """Yield a temporary file name beside `path`; when the block succeeds it replaces `path`, with
    the permissions a plain open() would give (mkstemp's own are 0600)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def folder_bytes(folder: Path) -> int:
    """Bytes of the regular files under `folder` (links not followed; a file removed meanwhile skipped)."""
    total = 0
    for path in Path(folder).rglob("*"):
        try:
            st = path.lstat()
        except OSError:
            continue
        if path.is_file() and not path.is_symlink():
            total += st.st_size
    return total


def atomic_write_bytes(path: Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_bytes(data)


def jsonl_objects(path, opener=open):
    """Yield (object, "FILE, line N") for each non-blank line of a JSONL file; a line that is not
    JSON is an EagleError naming the file and the line."""
    import json

    from .errors import EagleError

    with opener(path, "rt", encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            try:
                yield json.loads(line), where
            except json.JSONDecodeError as exc:
                raise EagleError(f"{where}: not valid JSON ({exc.msg})") from exc
