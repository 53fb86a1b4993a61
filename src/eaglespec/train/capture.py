"""Feature capture: run the target over the examples and store, per example, the token ids, the
loss mask and the target's features f (last hidden state after the final norm).

A capture directory holds
    manifest.json             target identity, options, data summary, the list of complete shards
    shard-00000.safetensors   input_ids [N] int32, loss_mask [N] uint8, features [N, H] (bf16 by
                              default), offsets [n+1] int64: example j is rows offsets[j]:offsets[j+1]
Each shard is written to a temporary file and renamed, and enters the manifest only once it is
complete, so a reader never sees half a shard and a rerun continues after the last complete one.
`OnlineDataset` is the alternative without disk: features computed from the target when read.
"""

from __future__ import annotations

import bisect
import errno
import itertools
import json
import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn.utils.rnn import pad_sequence
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from ..engine.target import FINGERPRINT_SCHEME
from ..errors import EagleError
from ..files import atomic_path, atomic_write_bytes
from ..memory import peak_rss_mb
from ..pause import PAUSE_FILE, idle, wait_if_paused
from .config import CaptureConfig, parse_layers, to_dict
from .data import DataSummary, Example, check_usable, cut_loops, iter_examples, source_digest

MANIFEST = "manifest.json"
FORMAT = "eaglespec-capture/1"
STORAGE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_IDENTITY_KEYS = ("model_type", "hidden_size", "vocab_size", "num_hidden_layers", "fingerprint")


@dataclass
class Sample:
    input_ids: torch.Tensor  # [T] int64
    loss_mask: torch.Tensor  # [T] bool
    features: torch.Tensor   # [T, H] f from the target
    hidden: torch.Tensor | None = None  # [T, k*H] the fused layers of an EAGLE-3 head, when captured


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.safetensors"


def check_identity(recorded: dict, target, what: str) -> None:
    """Refuse data or checkpoints made with another target (its weights, not its name, decide)."""
    ours = target.identity()
    diff = [k for k in _IDENTITY_KEYS if recorded.get(k) != ours[k]]
    if diff:
        k = diff[0]
        if k == "fingerprint" and not str(recorded.get(k)).startswith(FINGERPRINT_SCHEME):
            raise EagleError(f"{what} was made by an older eaglespec, whose weight fingerprints differ: capture "
                             "again (--overwrite) or train afresh (--no-resume)")
        raise EagleError(f"{what} was made for target {recorded.get('name')!r} ({k}={recorded.get(k)}), not for "
                         f"{ours['name']!r} ({k}={ours[k]}): use the same --target or start a new one")


def read_manifest(directory: Path) -> dict:
    path = directory / MANIFEST
    if not path.is_file():
        raise EagleError(f"{directory} has no {MANIFEST}: it is not a capture directory; make one with eaglespec capture")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EagleError(f"{path} is not valid JSON ({exc}); rerun eaglespec capture with --overwrite") from exc
    if manifest.get("format") != FORMAT:
        raise EagleError(f"{path} has format {manifest.get('format')!r}, this version reads {FORMAT!r}; recapture")
    return manifest


def _write_manifest(directory: Path, manifest: dict) -> None:
    atomic_write_bytes(directory / MANIFEST, json.dumps(manifest, indent=2).encode())


def _write_shard(directory: Path, index: int, examples: list[Sample]) -> dict:
    lengths = [len(s.input_ids) for s in examples]
    offsets = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int64)
    tensors = {
        "input_ids": torch.cat([s.input_ids for s in examples]).to(torch.int32),
        "loss_mask": torch.cat([s.loss_mask for s in examples]).to(torch.uint8),
        "features": torch.cat([s.features for s in examples]).contiguous(),
        "offsets": offsets,
    }
    if examples[0].hidden is not None:
        tensors["hidden"] = torch.cat([s.hidden for s in examples]).contiguous()
    with atomic_path(directory / shard_name(index)) as tmp:
        try:
            save_file(tensors, tmp)
        except SafetensorError as exc:  # its I/O errors arrive as text: "... (os error 28)"
            code = re.search(r"\(os error (\d+)\)", str(exc))
            if code is None:
                raise
            raise OSError(int(code[1]), os.strerror(int(code[1]))) from exc
    return {"file": shard_name(index), "examples": len(examples), "tokens": int(offsets[-1])}


def _clear(directory: Path) -> None:
    """--overwrite: remove what a capture writes, nothing else."""
    for path in directory.iterdir():
        if path.name == MANIFEST or path.suffix == ".tmp" or (path.name.startswith("shard-") and path.suffix == ".safetensors"):
            path.unlink()


def capture(target, config: CaptureConfig, out_dir: str | os.PathLike, examples: Iterable[Example] | None = None,
            overwrite: bool = False, progress: bool = True) -> dict:
    """Capture features for `examples` (default: those of `config`'s data, rendered with the
    target's tokenizer) into `out_dir`, continuing an interrupted capture. Returns the manifest."""
    directory = Path(out_dir).expanduser()
    options = to_dict(config)
    manifest = None
    if not overwrite and (directory / MANIFEST).exists():
        manifest = read_manifest(directory)
        check_identity(manifest["target"], target, f"capture directory {directory}")
        # an option added since the capture was started reads as its default; one this version lacks differs
        recorded = {**to_dict(CaptureConfig()), **manifest["options"]}
        diff = sorted(k for k in recorded if k not in options or recorded[k] != options[k])
        if diff:
            raise EagleError(f"capture directory {directory} was made with other options ({', '.join(diff)}): "
                             "rerun with the same options to resume, or pass --overwrite or another --out")
        dtype = str(target.dtype).removeprefix("torch.")
        if manifest.get("compute_dtype", dtype) != dtype:
            raise EagleError(f"capture directory {directory} was started with the target in {manifest['compute_dtype']}, "
                             f"this run has {dtype}: resume with --compute-dtype {manifest['compute_dtype']}, or pass "
                             "--overwrite or another --out")
        if manifest["complete"]:
            return manifest
    digest = None if examples is not None else source_digest(config.data)  # given examples have no file
    if manifest is not None and None not in (manifest.get("data_sha256"), digest) and manifest["data_sha256"] != digest:
        raise EagleError(f"the data {config.data} changed since capture directory {directory} was started "
                         "(its SHA-256 differs): resume with the same file, or pass --overwrite or another --out")

    # read the data before anything is written or removed: a wrong --data loses nothing
    summary = DataSummary()
    if examples is None:
        examples = iter_examples(target.tokenizer, config, summary, config.loop_cut)
    elif config.loop_cut:
        examples = (cut_loops(example, config.loop_cut)[0] for example in examples)
    examples = iter(examples)
    first = next(examples, None)
    if first is None:
        check_usable(summary, config)
        raise EagleError(f"no examples to capture into {directory}")
    examples = itertools.chain([first], examples)

    layers = parse_layers(config.aux_layers, target.config.num_hidden_layers) if config.aux_layers else None
    directory.mkdir(parents=True, exist_ok=True)
    if overwrite:
        _clear(directory)
    if manifest is None:
        if any(p.name not in (MANIFEST, PAUSE_FILE) for p in directory.iterdir() if p.suffix != ".tmp"):
            raise EagleError(f"{directory} is not empty and holds no capture: pass an empty or new --out")
        manifest = {"format": FORMAT, "target": target.identity(), "options": options,
                    "feature_dtype": config.feature_dtype, "hidden_size": target.hidden_size,
                    "aux_layers": list(layers) if layers else None,
                    "compute_dtype": str(target.dtype).removeprefix("torch."),
                    "data_sha256": digest, "examples": 0, "tokens": 0, "shards": [], "complete": False,
                    "summary": None}
        _write_manifest(directory, manifest)
    done = manifest["examples"]
    storage = STORAGE_DTYPES[config.feature_dtype]
    bar = tqdm(total=config.max_examples, initial=done, unit="ex", desc="capture", disable=not progress,
               dynamic_ncols=True)
    pending: list[Sample] = []
    started = time.monotonic()
    with bar:
        for example in itertools.islice(examples, done, None):
            started += wait_if_paused(directory, bar.write)  # a benchmark or a PAUSE file: time paused is not capture time
            states = target.capture_states(example.input_ids[None], layers=layers)
            hidden = states.hidden[0].to(storage).cpu() if layers else None  # [T, k*H]
            pending.append(Sample(example.input_ids, example.loss_mask, states.features[0].to(storage).cpu(), hidden))
            if bar.total is None and summary.available:  # known once the source is read: an upper bound
                bar.total = min(summary.available, config.max_examples or summary.available)
            bar.update(1)
            if len(pending) == config.shard_size:
                _commit(directory, manifest, pending, time.monotonic() - started)
                pending, started = [], time.monotonic()
                bar.set_postfix(tokens=manifest["tokens"], shards=len(manifest["shards"]))
        if pending:
            _commit(directory, manifest, pending, time.monotonic() - started)
    idle()  # no more pause checks: benchmarks need not wait for this job
    if summary.conversations:  # examples came from our own reader, which counted the whole source
        check_usable(summary, config)
        manifest["summary"] = summary.to_dict()
    if manifest["examples"] == 0:
        raise EagleError(f"no examples to capture into {directory}")
    manifest["complete"] = True
    _write_manifest(directory, manifest)
    return manifest


def _commit(directory: Path, manifest: dict, pending: list[Sample], seconds: float) -> None:
    """Write a shard, then list it in the manifest with its capture seconds and the process's peak
    memory so far. A full disk stops the job with the capture still resumable: a half-written
    shard is removed (atomic_path), a written but unlisted one is overwritten by the rerun, and
    the manifest lists only complete shards."""
    shards = manifest["shards"]
    try:
        entry = _write_shard(directory, len(shards), pending)
        entry.update(seconds=round(seconds, 2), peak_rss_mb=peak_rss_mb())
        updated = {**manifest, "shards": [*shards, entry], "examples": manifest["examples"] + entry["examples"],
                   "tokens": manifest["tokens"] + entry["tokens"]}
        _write_manifest(directory, updated)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise EagleError(f"the disk holding {directory} is full ({exc.strerror}) while writing shard {len(shards)}: "
                         f"the {len(shards)} complete shard(s) ({manifest['examples']} conversations) are kept; free "
                         "some space and rerun the same command to continue") from exc
    manifest.update(updated)


class FeatureDataset:
    """The examples of a capture directory, read lazily (only the rows asked for). An unfinished
    capture is refused unless `partial`: then its complete shards are used. hidden=False leaves a
    capture's fused layers unread (an EAGLE-1 head needs only the features: a quarter of the
    bytes of a capture made with --aux-layers)."""

    def __init__(self, directory: str | os.PathLike, partial: bool = False, hidden: bool = True):
        self.directory = Path(directory).expanduser()
        self.read_hidden = hidden
        self.manifest = read_manifest(self.directory)
        if not self.manifest["complete"] and not (partial and self.manifest["shards"]):
            raise EagleError(f"capture in {self.directory} is incomplete ({self.manifest['examples']} examples so far): "
                             "rerun the same eaglespec capture command to finish it, or pass --partial to train on them")
        self.identity = self.manifest["target"]
        self._starts = [0, *itertools.accumulate(s["examples"] for s in self.manifest["shards"])]
        self._files: dict[int, object] = {}
        self._offsets: dict[int, torch.Tensor] = {}
        for shard in self.manifest["shards"]:
            if not (self.directory / shard["file"]).is_file():
                raise EagleError(f"{self.directory / shard['file']} is missing: the capture is damaged; recapture with --overwrite")

    def __len__(self) -> int:
        return self._starts[-1]

    def _shard(self, k: int):
        if k not in self._files:
            handle = safe_open(str(self.directory / self.manifest["shards"][k]["file"]), framework="pt")
            self._files[k] = handle
            self._offsets[k] = handle.get_tensor("offsets")
        return self._files[k], self._offsets[k]

    def _rows(self, index: int):
        if not 0 <= index < len(self):
            raise IndexError(index)
        k = bisect.bisect_right(self._starts, index) - 1
        handle, offsets = self._shard(k)
        j = index - self._starts[k]
        return handle, int(offsets[j]), int(offsets[j + 1])

    def tokens(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids [T], loss_mask [T]) without reading the features."""
        handle, a, b = self._rows(index)
        return handle.get_slice("input_ids")[a:b].long(), handle.get_slice("loss_mask")[a:b].bool()

    @property
    def layers(self) -> tuple[int, ...] | None:
        """The target layers whose fused states the capture holds (EAGLE-3), or None."""
        ids = self.manifest.get("aux_layers")
        return tuple(ids) if ids else None

    def __getitem__(self, index: int) -> Sample:
        handle, a, b = self._rows(index)
        input_ids, loss_mask = self.tokens(index)
        hidden = handle.get_slice("hidden")[a:b] if self.layers and self.read_hidden else None
        return Sample(input_ids, loss_mask, handle.get_slice("features")[a:b], hidden)


class OnlineDataset:
    """Examples whose features are computed by the target when read: no disk, one target forward
    per read (training reads each example once per epoch, evaluation once more)."""

    def __init__(self, target, examples: list[Example], layers: tuple[int, ...] | None = None):
        self.target = target
        self.examples = examples
        self.layers = layers
        self.identity = target.identity()

    def __len__(self) -> int:
        return len(self.examples)

    def tokens(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.examples[index].input_ids, self.examples[index].loss_mask

    def __getitem__(self, index: int) -> Sample:
        return self.samples([index])[0]

    def samples(self, indices: list[int]) -> list[Sample]:
        """Several examples from one target forward, right-padded: under causal attention each one's
        features are its own forward's, up to float rounding."""
        examples = [self.examples[i] for i in indices]
        lengths = [e.input_ids.numel() for e in examples]
        ids = pad_sequence([e.input_ids for e in examples], batch_first=True)
        keep = pad_sequence([torch.ones(n, dtype=torch.bool) for n in lengths], batch_first=True)
        states = self.target.capture_states(ids, attention_mask=None if len(examples) == 1 else keep,
                                            layers=self.layers)
        return [Sample(e.input_ids, e.loss_mask, states.features[row, :n],
                       states.hidden[row, :n] if self.layers else None)
                for row, (e, n) in enumerate(zip(examples, lengths))]
