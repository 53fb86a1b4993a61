"""Heads shipped inside the package, found by the target's fingerprint or by name.

Each folder of `heads/` is a head directory. `--head default` takes the head trained for this
exact target (matched by weight fingerprint) whose config marks it `"default": true` in its
`eaglespec` block (or the only match); `--head NAME` takes the folder NAME, so older heads stay
loadable after a new default ships.
"""

from __future__ import annotations

import json
from pathlib import Path

HEADS_DIR = Path(__file__).parent.parent / "heads"


def _extra(directory: Path) -> dict:
    return json.loads((directory / "config.json").read_text()).get("eaglespec", {})


def shipped_names() -> list[str]:
    return sorted(p.parent.name for p in HEADS_DIR.glob("*/config.json")) if HEADS_DIR.is_dir() else []


def named_head_dir(name: str) -> Path | None:
    """The shipped head folder called `name`, if there is one."""
    return HEADS_DIR / name if name in shipped_names() else None


def head_dir_for(name_or_path: str) -> Path | None:
    """A head argument -> its folder: the directory itself when there is one, else the shipped head
    of that name, else None."""
    path = Path(name_or_path).expanduser()
    return path if path.is_dir() else named_head_dir(name_or_path)


def default_head_dir(target) -> Path | None:
    """The shipped head trained for this exact target (matched by weight fingerprint), if any;
    among several, the one marked default."""
    fingerprint = target.fingerprint()
    matches = [HEADS_DIR / n for n in shipped_names()
               if _extra(HEADS_DIR / n).get("target", {}).get("fingerprint") == fingerprint]
    marked = [m for m in matches if _extra(m).get("default")]
    return (marked or matches or [None])[0]
