"""Dequantized copies of GGUF targets, kept so that later starts skip transformers' GGUF reader.

transformers loads a .gguf file by parsing its metadata three times (SmolLM2's tokenizer alone is
441k fields) and dequantizing every tensor: 16-26 s for SmolLM2-135M on a 2-core CPU, most of a
start. The first load writes what it produced (the weights as loaded, as safetensors; config,
generation config, tokenizer) into `<cache>/targets/<file stem>-<key digest>/`, and later loads
read that folder in under a second, the same tensors bit for bit. The key is the file (resolved
path, size, modification time), the load dtype and the transformers and gguf versions: a changed
file or an upgrade makes a new folder. A folder is written under a temporary name and renamed
when whole, with its key file written last, so an interrupted write is never trusted; a damaged
one is removed, said so, and written again; writing one removes the copies no start can load
again (this file in this dtype and these versions, rewritten since; a .gguf deleted), said so.
`EAGLESPEC_GGUF_COPIES` names another folder, or `off` keeps no copies (a copy costs the fp32
weights' size on disk: 538 MB for SmolLM2-135M).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import torch

from ..errors import one_line
from ..files import cache_dir, folder_bytes

COPIES_ENV = "EAGLESPEC_GGUF_COPIES"
KEY_FILE = "eaglespec-gguf-copy.json"
SCHEME = 1  # bump when what a copy holds changes


def locate(gguf: Path, dtype: torch.dtype) -> tuple[Path, dict] | None:
    """Where the copy of `gguf` loaded in `dtype` lives, and its key; None when copies are off."""
    setting = os.environ.get(COPIES_ENV, "").strip()
    if setting.lower() in ("off", "0", "no", "false"):
        return None
    stat = gguf.stat()
    key = {"scheme": SCHEME, "file": str(gguf.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
           "dtype": str(dtype).removeprefix("torch."), "transformers": _version("transformers"), "gguf": _version("gguf")}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    root = Path(setting).expanduser() if setting else cache_dir() / "targets"
    return root / f"{gguf.stem}-{digest}", key


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def load(folder: Path, key: dict, loader):
    """-> loader(folder) (the caller's Hugging Face loading of a model folder) for a whole copy
    made under `key`, or None: there is none, or it was damaged (removed and said so; the caller
    loads the .gguf and writes it again)."""
    try:
        trusted = json.loads((folder / KEY_FILE).read_text()).get("key") == key
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        trusted = False
    if not trusted:
        return None
    try:
        return loader(folder)
    except Exception as exc:  # a truncated safetensors file, a deleted tokenizer: load the .gguf again
        print(f"note: ignored the damaged copy {folder} ({one_line(exc)}); reading the .gguf file and writing it again",
              file=sys.stderr)
        shutil.rmtree(folder, ignore_errors=True)
        return None


def write(folder: Path, key: dict, model, tokenizer) -> None:
    """Keep what the .gguf load produced in `folder` (atomically: a temporary folder renamed when
    whole). A full or unwritable disk only means reading the .gguf again next time, said so."""
    from safetensors.torch import save_file

    weights, seen = {}, set()
    for name, tensor in model.state_dict().items():  # a tied LM head is the embedding: stored once, tied on load
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            weights[name] = tensor.detach().to("cpu").contiguous()
    size = sum(t.numel() * t.element_size() for t in weights.values())
    partial = folder.with_name(f".{folder.name}.partial-{os.getpid()}")
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        if shutil.disk_usage(folder.parent).free < 2 * size:
            print(f"note: no dequantized copy of the target kept: {folder.parent} has under {2 * size / 1e9:.1f} GB free "
                  f"(later starts read the .gguf again; {COPIES_ENV}=off stops trying)", file=sys.stderr)
            return
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        save_file(weights, partial / "model.safetensors", metadata={"format": "pt"})
        model.config.save_pretrained(partial)
        config = json.loads((partial / "config.json").read_text())
        config.pop("quantization_config", None)  # the GGUF loader's marker: the copy holds plain tensors
        (partial / "config.json").write_text(json.dumps(config, indent=2))
        if model.generation_config is not None:
            model.generation_config.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        (partial / KEY_FILE).write_text(json.dumps({"key": key}, indent=1))  # last: what makes the copy trusted
        shutil.rmtree(folder, ignore_errors=True)  # an untrusted leftover under the same name
        os.rename(partial, folder)
    except Exception as exc:  # OSError, or safetensors' own error on a full disk: never a failed load
        shutil.rmtree(partial, ignore_errors=True)
        print(f"note: no dequantized copy of the target kept in {folder.parent} ({one_line(exc)}); "
              f"later starts read the .gguf again ({COPIES_ENV} names another folder, or off)", file=sys.stderr)
        return
    print(f"[eaglespec] kept a dequantized copy of {key['file']} ({size / 1e6:.0f} MB) in {folder}: later starts load "
          f"it instead of the .gguf ({COPIES_ENV}=off keeps none)", file=sys.stderr)
    try:
        removed, freed = prune(folder.parent, key, keep=folder)
    except Exception:  # pruning is housekeeping: never a failed load
        return
    if removed:
        print(f"[eaglespec] removed {removed} older cop{'y' if removed == 1 else 'ies'} ({freed / 1e6:.0f} MB) that no "
              "start can load again (their .gguf was rewritten or deleted)", file=sys.stderr)


def _dead(other: dict, key: dict) -> bool:
    """Whether no start can load the copy keyed `other` again: its .gguf was deleted from a folder
    that still exists (an unmounted share is left alone), or it is this file in this dtype and
    these versions, rewritten since (its size or time changed). Other versions' copies are kept:
    another environment may share the folder."""
    file = Path(str(other.get("file")))
    try:
        stat = file.stat()
    except FileNotFoundError:
        return file.parent.is_dir()
    same = all(other.get(k) == key.get(k) for k in ("file", "dtype", "transformers", "gguf", "scheme"))
    return same and (other.get("size"), other.get("mtime_ns")) != (stat.st_size, stat.st_mtime_ns)


def prune(root: Path, key: dict, keep: Path | None = None) -> tuple[int, int]:
    """Remove the copies under `root` that no start can load again (`_dead`), after writing the copy
    of `key` (`keep`: never removed); a half-written, foreign or unreadable folder is left alone.
    -> (copies, bytes) removed."""
    removed = freed = 0
    for folder in root.iterdir():
        try:
            if folder.name.startswith(".") or folder.is_symlink() or not folder.is_dir() or folder == keep:
                continue
            other = json.loads((folder / KEY_FILE).read_text())["key"]
            if not isinstance(other, dict) or not _dead(other, key):
                continue
            size = folder_bytes(folder)
            shutil.rmtree(folder, ignore_errors=True)
            if not folder.exists():
                removed, freed = removed + 1, freed + size
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
            continue
    return removed, freed
