"""The compiled-step folders in the cache: list them, and remove those no later start can load.

Each folder under <cache>/compiled/ holds one target's packages for one machine and one software
stack (compiled.artefact_key): a few hundred MB per graph, since a frozen graph carries its
weights, so 3-9 GB for a target compiled at several shapes. A folder made under an older
artefact scheme or another torch, transformers or eaglespec version is never loaded again (its key
cannot match); a folder for another CPU, thread count, target, dtype or GEMM micro-kernel block (its
CPU's choice) still can be, on that machine or with that model, and is kept.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

ARTEFACT_SCHEME = 8  # bump when what a package holds changes (2: an untied LM head; 3: GQA attention;
# 4: constants beside the .so, shared across packages; 5: on a CPU, a single-row step's GEMMs
# are C++ templates; 6: so are those of steps up to 8 rows, in register blocks of 4 rows; 7: of 2
# rows on Intel CPUs, the block part of the key; 8: Intel CPUs prefetch the weights, key "gemm_block")
MANIFEST = "eaglespec-compiled.json"
SOFTWARE = ("torch", "transformers", "eaglespec")  # a folder made under other versions is never loaded
NOTE_BYTES = 1 << 30  # stale folders above this size get a note when a new folder is made


@dataclass(frozen=True)
class CompiledFolder:
    path: Path
    key: dict | None    # its manifest's artefact key; None when unreadable
    bytes: int
    last_used: float    # newest modification time inside it (a load rewrites nothing, so: last built)
    stale: str | None   # why no start can load it again, or None


def installed_versions() -> dict[str, str]:
    """The SOFTWARE part of an artefact key (compiled.artefact_key)."""
    import torch
    import transformers

    from .. import __version__

    return {"torch": torch.__version__, "transformers": transformers.__version__, "eaglespec": __version__}


def weights_digest(module) -> str:
    """SHA-256 (16 hex digits) of a module's tensors, with their names: tells two heads (or two
    draft vocabularies) of the same shapes apart, e.g. a retrained head in the same directory."""
    import hashlib

    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(memoryview(tensor.detach().float().cpu().contiguous().numpy()))
    return h.hexdigest()[:16]


def stale_reason(key: dict | None, versions: dict[str, str]) -> str | None:
    if not isinstance(key, dict):
        return "its manifest is unreadable"
    if key.get("scheme") != ARTEFACT_SCHEME:
        return f"artefact scheme {key.get('scheme')}, this eaglespec writes {ARTEFACT_SCHEME}"
    for name in SOFTWARE:
        if key.get(name) != versions[name]:
            return f"made by {name} {key.get(name)}, {versions[name]} is installed"
    return None


def _size_and_mtime(folder: Path) -> tuple[int, float]:
    size, newest = 0, folder.stat().st_mtime
    for path in folder.rglob("*"):
        try:
            st = path.lstat()
        except OSError:  # removed meanwhile
            continue
        newest = max(newest, st.st_mtime)
        if path.is_file() and not path.is_symlink():
            size += st.st_size
    return size, newest


def compiled_folders(root: Path | None = None, versions: dict[str, str] | None = None) -> list[CompiledFolder]:
    """Every folder under <cache>/compiled (or root/compiled), oldest use first."""
    from ..files import cache_dir

    base = Path(root or cache_dir()) / "compiled"
    versions = versions or installed_versions()
    found = []
    for folder in sorted(p for p in base.glob("*") if p.is_dir()) if base.is_dir() else []:
        try:
            key = json.loads((folder / MANIFEST).read_text()).get("key")
        except (OSError, UnicodeDecodeError, ValueError, AttributeError):
            key = None
        size, used = _size_and_mtime(folder)
        found.append(CompiledFolder(folder, key, size, used, stale_reason(key, versions)))
    return sorted(found, key=lambda f: f.last_used)


def prune(folders: list[CompiledFolder]) -> int:
    """Remove the stale folders; -> bytes freed."""
    freed = 0
    for folder in folders:
        if folder.stale is not None:
            shutil.rmtree(folder.path, ignore_errors=True)
            freed += folder.bytes
    return freed


def describe(folders: list[CompiledFolder]) -> str:
    """A table for `eaglespec compile --list`."""
    if not folders:
        return "no compiled steps in the cache"
    lines = []
    for f in folders:
        key = f.key or {}
        what = (f"{key.get('gpu') or key.get('cpu') or key.get('device', '?')}, {key.get('threads', '?')} threads, "
                f"{key.get('dtype', '?')}, torch {key.get('torch', '?')}, scheme {key.get('scheme', '?')}")
        state = f"stale: {f.stale}" if f.stale else "current"
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(f.last_used))
        lines.append(f"{f.path}  {f.bytes / 1e9:5.1f} GB  built {when}  {what}  [{state}]")
    stale = [f for f in folders if f.stale]
    if stale:
        lines.append(f"{len(stale)} stale folder(s), {sum(f.bytes for f in stale) / 1e9:.1f} GB: "
                     "`eaglespec compile --prune` removes them")
    return "\n".join(lines)


def stale_note(root: Path | None = None) -> str:
    """A one-line note when stale folders hold more than NOTE_BYTES, else ''."""
    stale = [f for f in compiled_folders(root) if f.stale]
    total = sum(f.bytes for f in stale)
    if total <= NOTE_BYTES:
        return ""
    return (f"note: {total / 1e9:.1f} GB of compiled steps in the cache can never be loaded again (older versions): "
            "`eaglespec compile --prune` removes them")
