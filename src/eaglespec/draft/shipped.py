"""Heads shipped inside the package, found by the target's fingerprint."""

from __future__ import annotations

import json
from pathlib import Path

HEADS_DIR = Path(__file__).parent.parent / "heads"


def default_head_dir(target) -> Path | None:
    """The shipped head trained for this exact target (matched by weight fingerprint), if any."""
    if not HEADS_DIR.is_dir():
        return None
    fingerprint = target.fingerprint()
    for cfg in sorted(HEADS_DIR.glob("*/config.json")):
        extra = json.loads(cfg.read_text()).get("eaglespec", {})
        if extra.get("target", {}).get("fingerprint") == fingerprint:
            return cfg.parent
    return None
