"""Atomic file replacement for capture shards, manifests, checkpoints and metrics: a reader sees
the old file or the new one, never a part."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


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
