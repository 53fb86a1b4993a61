"""The working tree a lent GPU machine's call carries, made small enough for the bundle's parts.

A device call carries the checkout's tracked files and its untracked, not ignored ones, at most 64
MiB in all with the paths it names. The tracked tree is ~116 MB (the shipped heads), so before the
calls of docs/gpu.md the index is made to hold only what runs there (SLIM: the source without its
heads, the tests, the scripts, pyproject.toml, the Makefile), the rest ignored through
.git/info/exclude; afterwards the index and the exclude file are restored exactly:

    python -m eaglespec.tools.device_tree slim      # before the device calls (no file is touched)
    python -m eaglespec.tools.device_tree size      # what one call would carry, with .device/a and .device/b
    python -m eaglespec.tools.device_tree unslim    # after them: the index as it was

Only git's index, .git/info/exclude and (where none is installed) a pre-commit hook that refuses
commits change; the files on disk stay. A commit while slim would delete the heads, hence the hook.
`slim` undoes itself on any failure and refuses to run twice; `unslim` says when there is nothing to
restore, and when HEAD moved meanwhile.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from pathlib import Path

from ..errors import EagleError
from ..files import folder_bytes

CALL_BYTES = 64 * 2 ** 20  # what one device call carries, the tree and the named paths together
SLIM = ("src", "tests", "scripts", "pyproject.toml", "Makefile")
LEFT_OUT = ("src/eaglespec/heads",)  # inside SLIM, yet not carried: ~116 MB of shipped heads
BACKUP = "eaglespec-slim"  # in the git folder while slim: the index, exclude file, HEAD and hook to restore
BEGIN, END = "# eaglespec device_tree slim: begin", "# eaglespec device_tree slim: end"


def _git(repo: Path, *args: str, stdin: str | None = None) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=repo, input=stdin, capture_output=True, text=True, check=True)
    except FileNotFoundError as exc:
        raise EagleError("git is not installed: the device tree is git's index") from exc
    except subprocess.CalledProcessError as exc:
        raise EagleError(f"git {' '.join(args[:2])} failed in {repo}: {exc.stderr.strip() or exc}") from exc
    return done.stdout


def toplevel(path: Path) -> Path:
    """The checkout's root, from any folder inside it (git lists a subfolder's files only)."""
    return Path(_git(path, "rev-parse", "--show-toplevel").strip())


def git_path(repo: Path, name: str) -> Path:
    """Where git keeps `name` for this checkout (the index, info/exclude, hooks: a linked worktree's
    and $GIT_INDEX_FILE's own places)."""
    path = Path(_git(repo, "rev-parse", "--git-path", name).strip())
    return path if path.is_absolute() else repo / path


def carried(path: str) -> bool:
    """Whether a tracked path belongs to the slim tree."""
    inside = lambda roots: any(path == r or path.startswith(r + "/") for r in roots)  # noqa: E731
    return inside(SLIM) and not inside(LEFT_OUT)


def travelling(repo: Path) -> list[str]:
    """The files a device call would carry now: tracked, and untracked but not ignored."""
    listed = _git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    return sorted({p for p in listed.split("\0") if p and (repo / p).is_file()})


def tree_bytes(repo: Path, files: list[str] | None = None) -> int:
    return sum((repo / p).stat().st_size for p in (travelling(repo) if files is None else files))


def slim_bytes(repo: Path) -> int:
    """What the tree will weigh once slim (its tracked slim files; untracked files may add to it)."""
    return tree_bytes(repo, [p for p in _git(repo, "ls-files", "-z").split("\0") if p and carried(p)
                             and (repo / p).is_file()])


def is_slim(repo: Path) -> bool:
    return git_path(repo, BACKUP).is_dir()


def _pattern(path: str) -> str:
    """An exclude line matching exactly this path from the checkout's root."""
    if "\n" in path:
        raise EagleError(f"the tracked path {path!r} holds a newline: an exclude file cannot name it")
    for c in "\\[*?":
        path = path.replace(c, "\\" + c)
    stripped = path.rstrip(" ")  # git strips unescaped trailing spaces
    return "/" + stripped + "\\ " * (len(path) - len(stripped))


def slim(repo: Path) -> int:
    """Take every tracked file outside the slim tree out of the index (kept on disk, ignored), and
    refuse commits until `unslim` (a temporary pre-commit hook, where none is installed);
    -> the bytes a call's tree now carries. On any failure, everything is as it was."""
    backup = git_path(repo, BACKUP)
    if backup.is_dir():
        raise EagleError(f"the index is slim already ({backup} exists): run `python -m "
                         "eaglespec.tools.device_tree unslim` first")
    index, exclude, hook = (git_path(repo, n) for n in ("index", "info/exclude", "hooks/pre-commit"))
    dropped = [p for p in _git(repo, "ls-files", "-z").split("\0") if p and not carried(p)]
    lines = [BEGIN, *map(_pattern, dropped), END]
    backup.mkdir(parents=True)
    try:
        shutil.copyfile(index, backup / "index")
        (backup / "HEAD").write_text(_head(repo))
        before = exclude.read_bytes() if exclude.is_file() else None
        if before is not None:
            (backup / "exclude").write_bytes(before)
        exclude.parent.mkdir(parents=True, exist_ok=True)
        text = (before or b"").decode()
        exclude.write_text(text + ("\n" if text and not text.endswith("\n") else "") + "\n".join(lines) + "\n")
        if not hook.exists():
            hook.parent.mkdir(parents=True, exist_ok=True)
            hook.write_text("#!/bin/sh\necho 'the index is slim for a device call (eaglespec.tools.device_tree): "
                            "run `python -m eaglespec.tools.device_tree unslim` before committing' >&2\nexit 1\n")
            hook.chmod(0o755)
            (backup / "hook").write_text(str(hook))
        if dropped:  # -f: a staged change outside the slim tree comes back with the index
            _git(repo, "--literal-pathspecs", "rm", "-q", "-f", "--cached", "--pathspec-from-file=-",
                 "--pathspec-file-nul", stdin="\0".join(dropped))
    except BaseException:
        _restore(repo, backup)
        raise
    return tree_bytes(repo)


def _head(repo: Path) -> str:
    """HEAD's commit, or '' in a repository without one."""
    try:
        return _git(repo, "rev-parse", "-q", "--verify", "HEAD").strip()
    except EagleError:
        return ""


def _restore(repo: Path, backup: Path) -> None:
    """The index (under git's own lock), the exclude file byte for byte, the hook; then no backup."""
    index, exclude = git_path(repo, "index"), git_path(repo, "info/exclude")
    if (backup / "index").is_file():
        lock = index.with_name(index.name + ".lock")
        try:
            fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError as exc:
            raise EagleError(f"{lock} exists: another git command is writing the index; run unslim again when it "
                             "is done (the backup is kept)") from exc
        with os.fdopen(fd, "wb") as f:
            f.write((backup / "index").read_bytes())
        os.replace(lock, index)
    if (backup / "exclude").is_file():
        exclude.write_bytes((backup / "exclude").read_bytes())
    elif exclude.is_file():
        exclude.unlink()
    if (backup / "hook").is_file():
        Path((backup / "hook").read_text()).unlink(missing_ok=True)
    shutil.rmtree(backup)


def unslim(repo: Path) -> str:
    """The index, .git/info/exclude and the hooks as they were before `slim`; -> a warning, if any."""
    backup = git_path(repo, BACKUP)
    if not backup.is_dir():
        raise EagleError("the index is not slim (no backup to restore): nothing to do")
    head = (backup / "HEAD").read_text() if (backup / "HEAD").is_file() else ""
    now = _head(repo)
    _restore(repo, backup)
    return "" if head == now else f"note: HEAD moved while slim ({head[:12] or 'none'} -> {now[:12]}): check `git status`"


def call_sizes(repo: Path, bundle: Path) -> dict[str, int]:
    """Bytes each bundle call carries: the tree as it travels now, plus .device/a or .device/b."""
    tree = tree_bytes(repo)
    return {"tree": tree, **{f"call {p}": tree + folder_bytes(bundle / p) for p in ("a", "b") if (bundle / p).is_dir()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eaglespec.tools.device_tree", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("slim", "unslim", "size"))
    parser.add_argument("--repo", type=Path, default=Path("."))
    parser.add_argument("--bundle", type=Path, default=Path(".device"), help="for size: the bundle's folder")
    args = parser.parse_args(argv)
    try:
        repo = toplevel(args.repo)
        if args.command == "slim":
            n = slim(repo)
            print(f"slim: a device call now carries {n / 2 ** 20:.1f} MiB of tree; restore with "
                  "`python -m eaglespec.tools.device_tree unslim` (do not commit until then)")
        elif args.command == "unslim":
            warning = unslim(repo)
            print("unslim: the index and .git/info/exclude are as they were" + (f"; {warning}" if warning else ""))
        sizes = call_sizes(repo, repo / args.bundle)
        over = [k for k, v in sizes.items() if k != "tree" and v > CALL_BYTES]
        print(", ".join(f"{k} {v / 2 ** 20:.2f} MiB" for k, v in sizes.items()) + f" (a call carries at most "
              f"{CALL_BYTES / 2 ** 20:.0f} MiB)" + (f": {', '.join(over)} too big" if over else ""))
        return 1 if over and args.command != "unslim" else 0
    except EagleError as exc:
        parser.exit(2, f"device_tree: error: {exc}\n")


if __name__ == "__main__":
    raise SystemExit(main())
