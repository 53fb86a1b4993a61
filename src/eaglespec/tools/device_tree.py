"""The working tree a lent GPU machine's call carries, made small enough for the bundle's parts.

A device call carries the checkout's tracked files and its untracked, not ignored ones, at most 64
MiB in all with the paths it names. The tracked tree is ~97 MB (the shipped heads), so before the
calls of docs/gpu.md the index is made to hold only what runs there (SLIM: the source without its
heads, the tests, the scripts, pyproject.toml, the Makefile), the rest ignored through
.git/info/exclude; afterwards the index and the exclude file are restored exactly:

    python -m eaglespec.tools.device_tree slim      # before the device calls (no file is touched)
    python -m eaglespec.tools.device_tree size      # what one call would carry, with .device/a and .device/b
    python -m eaglespec.tools.device_tree unslim    # after them: the index as it was

Only git's index and .git/info/exclude change; the files on disk stay. Do not commit while slim
(a commit would delete the heads): `slim` refuses to run twice, `unslim` says when there is nothing
to restore.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from pathlib import Path

from ..errors import EagleError

CALL_BYTES = 64 * 2 ** 20  # what one device call carries, the tree and the named paths together
SLIM = ("src", "tests", "scripts", "pyproject.toml", "Makefile")
LEFT_OUT = ("src/eaglespec/heads",)  # inside SLIM, yet not carried: ~97 MB of shipped heads
BACKUP = "eaglespec-index.bak"  # beside .git/index while slim
BEGIN, END = "# eaglespec device_tree slim: begin", "# eaglespec device_tree slim: end"


def _git(repo: Path, *args: str, stdin: str | None = None) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=repo, input=stdin, capture_output=True, text=True, check=True)
    except FileNotFoundError as exc:
        raise EagleError("git is not installed: the device tree is git's index") from exc
    except subprocess.CalledProcessError as exc:
        raise EagleError(f"git {' '.join(args[:2])} failed in {repo}: {exc.stderr.strip() or exc}") from exc
    return done.stdout


def git_dir(repo: Path) -> Path:
    path = Path(_git(repo, "rev-parse", "--git-dir").strip())
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
    return (git_dir(repo) / BACKUP).is_file()


def _exclude(repo: Path) -> Path:
    return git_dir(repo) / "info" / "exclude"


def _without_block(text: str) -> str:
    if BEGIN not in text:
        return text
    head, rest = text.split(BEGIN, 1)
    return head.rstrip("\n") + ("\n" if head.strip() else "") + rest.split(END, 1)[1].lstrip("\n")


def slim(repo: Path) -> int:
    """Take every tracked file outside the slim tree out of the index (kept on disk, ignored);
    -> the bytes a call's tree now carries."""
    gd = git_dir(repo)
    if is_slim(repo):
        raise EagleError(f"the index is slim already ({gd / BACKUP} exists): run `python -m "
                         "eaglespec.tools.device_tree unslim` first")
    tracked = [p for p in _git(repo, "ls-files", "-z").split("\0") if p]
    dropped = [p for p in tracked if not carried(p)]
    shutil.copyfile(gd / "index", gd / BACKUP)
    exclude = _exclude(repo)
    exclude.parent.mkdir(parents=True, exist_ok=True)
    before = exclude.read_text() if exclude.is_file() else ""
    lines = [BEGIN, *("/" + p.replace("\\", "\\\\").replace("[", "\\[").replace("*", "\\*").replace("?", "\\?")
                      for p in dropped), END]
    exclude.write_text(before + ("\n" if before and not before.endswith("\n") else "") + "\n".join(lines) + "\n")
    if dropped:
        _git(repo, "rm", "-q", "--cached", "--pathspec-from-file=-", "--pathspec-file-nul",
             stdin="\0".join(":(literal)" + p for p in dropped))
    return tree_bytes(repo)


def unslim(repo: Path) -> None:
    """The index and .git/info/exclude as they were before `slim`."""
    gd = git_dir(repo)
    if not is_slim(repo):
        raise EagleError("the index is not slim (no backup to restore): nothing to do")
    os.replace(gd / BACKUP, gd / "index")
    exclude = _exclude(repo)
    if exclude.is_file():
        exclude.write_text(_without_block(exclude.read_text()))


def call_sizes(repo: Path, bundle: Path) -> dict[str, int]:
    """Bytes each bundle call carries: the tree as it travels now, plus .device/a or .device/b."""
    tree = tree_bytes(repo)
    part = lambda p: sum(f.stat().st_size for f in (bundle / p).rglob("*") if f.is_file())  # noqa: E731
    return {"tree": tree, **{f"call {p}": tree + part(p) for p in ("a", "b") if (bundle / p).is_dir()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eaglespec.tools.device_tree", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("slim", "unslim", "size"))
    parser.add_argument("--repo", type=Path, default=Path("."))
    parser.add_argument("--bundle", type=Path, default=Path(".device"), help="for size: the bundle's folder")
    args = parser.parse_args(argv)
    try:
        repo = Path(_git(args.repo, "rev-parse", "--show-toplevel").strip())
        if args.command == "slim":
            n = slim(repo)
            print(f"slim: a device call now carries {n / 2 ** 20:.1f} MiB of tree; restore with "
                  "`python -m eaglespec.tools.device_tree unslim` (do not commit until then)")
        elif args.command == "unslim":
            unslim(repo)
            print("unslim: the index and .git/info/exclude are as they were")
        sizes = call_sizes(repo, repo / args.bundle)
        over = [k for k, v in sizes.items() if k != "tree" and v > CALL_BYTES]
        print(", ".join(f"{k} {v / 2 ** 20:.2f} MiB" for k, v in sizes.items()) + f" (a call carries at most "
              f"{CALL_BYTES / 2 ** 20:.0f} MiB)" + (f": {', '.join(over)} too big" if over else ""))
        return 1 if over and args.command != "unslim" else 0
    except EagleError as exc:
        parser.exit(2, f"device_tree: error: {exc}\n")


if __name__ == "__main__":
    raise SystemExit(main())
