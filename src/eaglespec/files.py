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


def output_folder(path: Path, flag: str = "--out") -> Path:
    """Make the folder a command writes its results into, before the command's work, so that a
    path that is a file or a folder it cannot write is refused at once (not after an hour of
    measuring): an EagleError naming the flag. -> path."""
    from .errors import EagleError

    path = Path(path)
    if path.exists() and not path.is_dir():
        raise EagleError(f"{flag} {path} is a file: pass a folder for the results")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EagleError(f"{flag} {path}: cannot make the folder ({exc.strerror}): pass a folder you can write") from exc
    if not os.access(path, os.W_OK | os.X_OK):
        raise EagleError(f"{flag} {path}: this folder is not writable: pass a folder you can write")
    return path


def jsonl_objects(path, opener=open):
    """Yield (object, "FILE, line N") for each non-blank line of a JSONL file; a line that is not
    JSON, or a file that is not UTF-8 text (or, with a gzip opener, not gzip), is an EagleError
    naming the file (and the line)."""
    import json

    from .errors import EagleError

    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{path}, line {number}"
                try:
                    yield json.loads(line), where
                except json.JSONDecodeError as exc:
                    raise EagleError(f"{where}: not valid JSON ({exc.msg})") from exc
    except UnicodeDecodeError as exc:
        raise EagleError(f"{path} is not UTF-8 text (byte {exc.start}): pass a JSONL file, one JSON object a line") from exc
    except OSError as exc:  # gzip.BadGzipFile among them
        raise EagleError(f"{path}: cannot read it ({exc}): pass a readable JSONL file") from exc
