"""The compiled backend of the target adapter: the stock HF forward through `torch.compile`
(inductor, max-autotune GEMMs, frozen weights) over a static KV cache of ours.

Why: on a CPU the eager kernels decide whether EAGLE wins. MKL's one-row GEMV streams the weights
at half the DRAM bandwidth and its few-row GEMM at a quarter, so verifying 2-8 tokens costs
1.7-2x a single-token step; inductor's C++ micro-kernel GEMMs over pre-packed (frozen) weights run
near the bandwidth floor with a nearly flat cost up to 4-8 rows (docs/benchmarks.md; how they are
built on a CPU: gemm_kernels). The price is compile time, so the set of graphs is small and
fixed, one per bucket of

* query length (QUERY_BUCKETS: a tree is padded to the next one; padding nodes see only
  themselves, as the batch's padding already does),
* rows (BATCH_BUCKETS: padding rows are never read),
* cache length (CACHE_BUCKETS: the static buffers are sized, when a sequence joins, to hold its
  prompt, its budget and a tree, so a step reads a cache sized to its context, not the model's,
  and a generation never changes bucket midway).

Prefill stays eager: a prompt's hundreds of rows are compute-bound GEMMs, where MKL is at its
best, and compiling every prompt length would mean a graph per length. Its keys and values are
copied into the static buffers. Every decoding step, vanilla (q = 1) and verification (q = the
tree's bucket), runs compiled.

The cache is a class of ours, not transformers' StaticCache: that cache's layers write new keys at
their own running length (`cumulative_length`), whereas verification writes q speculative entries
after the used slots and keeps a few, moved into place after acceptance (`StaticRows.keep_paths`,
the gather/scatter of kv_cache.RowCache). HF's attention layers only call
`cache.update(k, v, layer_idx)`, which `_SlotWriter` answers by writing at the step's slots and
returning the whole buffers; the 4D mask says which slots each query sees.

Attention in the compiled graphs is HF's SDPA with `enable_gqa` (`gqa_attention`, registered
through transformers' AttentionInterface, the documented way to swap the attention function, set
only while a graph is traced). The stock SDPA path, given a mask, first copies each layer's keys
and values once per query group (`repeat_kv`): over a static cache that copy and the wider SDPA
cost about 8 ms of a 27 ms single-token step of SmolLM2-135M (profiled, docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

import torch
from torch.utils import _pytree

from ..errors import EagleError, one_line
from . import gemm_kernels
from .compiled_cache import ARTEFACT_SCHEME, MANIFEST, installed_versions, stale_note, weights_digest
from .kv_cache import RowCache, in_place, move_paths

QUERY_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
CACHE_BUCKETS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
MODES = ("auto", "on", "off")
EAGER_QUERIES = 16  # a head step wider than this (a joining prompt's pairs) runs eagerly on the same buffers
AUTO_TOKENS = 8  # --tree auto measures compiled trees of up to this many tokens (graphs for 1, 2, 4, 8)


def bucket(n: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket holding n."""
    for b in buckets:
        if n <= b:
            return b
    raise EagleError(f"{n} is beyond the compiled path's largest bucket ({buckets[-1]}); use --compile off")


def compiler_problem() -> str | None:
    """Why inductor's C++ backend cannot run here, or None: it needs the C++ compiler it will call
    ($CXX, else those torch._inductor.config.cpp.cxx names: g++) to build a shared library with
    OpenMP, as its kernels are built (tried once per process and compiler)."""
    import torch._inductor.config as inductor_config

    cxx = inductor_config.cpp.cxx
    names = [os.environ["CXX"]] if os.environ.get("CXX") else [
        c for c in (cxx if isinstance(cxx, (list, tuple)) else (cxx,)) if c]
    found = next((path for path in map(shutil.which, names) if path), None)
    if found is None:
        return f"no C++ compiler found ({' or '.join(names)} not on PATH)"
    return _build_problem(found)


_PROBE = """#include <omp.h>
#include <vector>
extern "C" int eaglespec_probe() { std::vector<int> v{1, omp_get_max_threads()}; return v[1]; }
"""


@functools.lru_cache(maxsize=None)
def _build_problem(cxx: str) -> str | None:
    """Why `cxx` cannot build a small C++17 shared library with the standard library and OpenMP
    (what inductor builds, in miniature: a fraction of a second), or None."""
    try:
        with tempfile.TemporaryDirectory(prefix="eaglespec-cxx-") as tmp:
            source = os.path.join(tmp, "probe.cpp")
            with open(source, "w") as f:
                f.write(_PROBE)
            cmd = [cxx, "-std=c++17", "-shared", "-fPIC", "-fopenmp", source, "-o", os.path.join(tmp, "probe.so")]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the C++ compiler {cxx} could not be tried ({one_line(exc)})"
    if done.returncode != 0:
        lines = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        said = next((line for line in lines if "error" in line.lower()), lines[0] if lines else f"exit {done.returncode}")
        return f"the C++ compiler {cxx} cannot build a shared library with OpenMP ({said[:200]})"
    return None


def limits_problem(tokens: int | None = None, rows: int | None = None) -> str | None:
    """Why a tree of `tokens` verification tokens or batches of `rows` sequences do not fit the
    compiled path's buckets, or None."""
    if rows is not None and rows > BATCH_BUCKETS[-1]:
        return f"--max-batch {rows} is beyond the compiled path's {BATCH_BUCKETS[-1]} rows"
    if tokens is not None and tokens > QUERY_BUCKETS[-1]:
        return f"the --tree verifies {tokens} tokens, beyond the compiled path's {QUERY_BUCKETS[-1]}"
    return None


# Why --compile auto stays eager on CUDA: the only time the compiled path ran on a GPU (an H200,
# torch 2.11.0+cu130, 2026-12-04) its first graph, the vanilla step, segfaulted while its
# AOTInductor package was built (after "No complete tensor found in the group ... weights are not on
# CPU" from torch.export's package writer). --compile on still takes that path, to test it.
CUDA_AUTO_EAGER = "the compiled path crashed building its first graph on the one GPU it ran on (docs/gpu.md)"


def disk_full(exc: BaseException) -> str | None:
    """Where `exc` (or an exception in its chain) says a disk is full: the file it named, '' when
    it named none, or None when it is not a full disk. A C++ build that runs out of space fails
    with the compiler's text, not an OSError, so the text counts too."""
    import errno

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return str(exc.filename or "")
        if "No space left on device" in str(exc) or "Disk quota exceeded" in str(exc):
            return ""
        exc = exc.__cause__ or exc.__context__
    return None


class CompileFailed(EagleError):
    """Building a graph's package failed (a full disk, an error inside inductor or the C++
    build): nothing half-built is kept. `reason` says what failed, for --compile auto's note
    (EagleGenerator.from_pretrained then runs the eager kernels); `what`: the graph; `full`: a disk
    was full; the message adds the fix."""

    def __init__(self, what: str, folder, exc: BaseException):
        where = disk_full(exc)
        self.full = where is not None
        self.what = what
        place = f"writing {where}" if where else f"its package goes to {folder}, the C++ build to the temporary folder"
        self.reason = (f"no space left on the disk while building {what} ({place})" if self.full
                       else f"building {what} failed ({one_line(exc, 200)})")
        fix = "free some space and start again, or" if self.full else "report it;"
        super().__init__(self.message(f"{fix} --compile off runs the eager kernels"))

    def message(self, fix: str) -> str:
        """The one line, with `fix` after what failed (a command that cannot use --compile off gives its own)."""
        return f"{self.reason}: nothing half-built is kept; {fix}"


def check_limits(mode: str, tokens: int | None = None, rows: int | None = None) -> None:
    """--compile on with a tree or batch beyond the buckets: the EagleError, before anything loads."""
    problem = limits_problem(tokens, rows) if mode == "on" else None
    if problem is not None:
        raise EagleError(f"--compile on: {problem}; lower it, or use --compile off")


def resolve_mode(mode: str, device: torch.device, tokens: int | None = None, rows: int | None = None
                 ) -> tuple[bool, str]:
    """--compile auto|on|off -> (compile?, why, said to the user). 'on' where it cannot work is an
    EagleError naming the cause and the fix. tokens, rows: the largest tree (verification tokens)
    and batch to run; beyond the buckets, auto runs eagerly."""
    if mode not in MODES:
        raise EagleError(f"--compile {mode!r}: choose auto, on or off")
    if mode == "off":
        return False, "eager kernels (--compile off)"
    check_limits(mode, tokens, rows)
    problem = limits_problem(tokens, rows)
    if problem is not None:  # auto: beyond the buckets, eager
        return False, f"eager kernels: {problem}"
    if device.type not in ("cpu", "cuda"):
        if mode == "on":
            raise EagleError(f"--compile on: the compiled path runs on cpu or cuda, not {device.type}; use --compile off")
        return False, f"eager kernels: the compiled path runs on cpu or cuda, not {device.type}"
    if device.type == "cuda" and mode == "auto":  # docs/gpu.md, the first run on an H200
        return False, (f"eager kernels: {CUDA_AUTO_EAGER}; --compile on to try it")
    problem = compiler_problem() if device.type == "cpu" else None
    if problem is not None:
        if mode == "on":
            raise EagleError(f"--compile on: {problem}; install a working one (apt-get install g++) or use --compile off")
        return False, f"eager kernels: {problem} (install a working g++ for the compiled path)"
    return True, f"compiled step (inductor, max-autotune GEMMs, frozen weights{'' if mode == 'on' else '; --compile off for eager'})"


class _SlotWriter:
    """The `cache` HF's attention layers see inside a compiled step: `update` writes the step's
    keys and values at `slots` of the static buffers and returns the whole buffers."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], slots: torch.Tensor):
        self.keys, self.values, self.slots = keys, values, slots

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        k, v = self.keys[layer_idx], self.values[layer_idx]  # [B, heads, S, d]
        k.index_copy_(2, self.slots, key_states)
        v.index_copy_(2, self.slots, value_states)
        return k, v

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0  # read only to default positions and masks, which every caller here passes


class StaticRows(RowCache):
    """The compiled backend's KV cache for the rows of a batch: per layer, key and value buffers
    [rows bucket, heads, cache bucket, d], all of them views of one tensor `kv` [2 x layers, rows
    bucket, heads, cache bucket, d] (keys first), so that moving the accepted paths' entries is one
    gather and one scatter, not two for each of SmolLM2's 60 buffers (0.12 against 1.0 ms here).
    RowCache's meaning: row r's entries are slots [0, lens[r]), `length` slots are in use; its
    methods act on the buffers instead of a DynamicCache."""

    def __init__(self, kv: torch.Tensor, lens: list[int], length: int):
        self._hold(kv)
        self.lens = torch.tensor(lens, dtype=torch.long)
        self._length = length

    def _hold(self, kv: torch.Tensor) -> None:
        self.kv = kv
        layers = kv.shape[0] // 2
        self.keys, self.values = list(kv[:layers].unbind(0)), list(kv[layers:].unbind(0))

    @classmethod
    def empty(cls, layers: int, heads: int, head_dim: int, rows: int, dtype, device, slots: int = 0) -> "StaticRows":
        """No entries yet, room for `slots` slots (at least the smallest cache bucket)."""
        shape = (2 * layers, bucket(max(rows, 1), BATCH_BUCKETS), heads, bucket(max(slots, 1), CACHE_BUCKETS), head_dim)
        return cls(torch.zeros(shape, dtype=dtype, device=device), [0] * rows, 0)

    @classmethod
    def from_dynamic(cls, cache, lens: list[int], slots: int) -> "StaticRows":
        """A prefill's DynamicCache rows -> static buffers with room for `slots` slots."""
        kv = torch.stack([layer.keys for layer in cache.layers] + [layer.values for layer in cache.layers])
        return cls(_sized(kv, bucket(len(lens), BATCH_BUCKETS), bucket(slots, CACHE_BUCKETS)), lens, cache.get_seq_length())

    @property
    def length(self) -> int:
        return self._length

    @property
    def capacity(self) -> int:
        return self.kv.shape[3]

    def reserve(self, slots: int, rows: int) -> None:
        """Room for `slots` slots and `rows` rows (buffers regrown to the next buckets)."""
        cap, b = self.capacity, self.kv.shape[1]
        want_s, want_b = max(cap, bucket(slots, CACHE_BUCKETS)), max(b, bucket(rows, BATCH_BUCKETS))
        if (want_s, want_b) != (cap, b):  # only the real rows' slots in use move
            self._hold(_sized(self.kv[:, :len(self), :, :self._length], want_b, want_s))

    def keep_paths(self, start: int, paths: list[torch.Tensor]) -> None:
        counts = [p.numel() for p in paths]
        if not in_place(self.lens, start, paths):
            move_paths([self.kv], self.lens, start, paths)
        self.lens += torch.tensor(counts)
        self._length = int(self.lens.max())

    def crop(self, length: int) -> None:
        self.lens = self.lens.clamp(max=length)
        self._length = min(self._length, length)

    def select(self, rows: list[int]) -> None:
        """Keep `rows`, in that order. Only the slots in use move: in the same rows bucket the rows
        that change place move up in place (the padding rows after them keep stale entries, which
        no row's mask shows, as with every slot past a row's length); a smaller bucket gets smaller
        buffers. A server's batch loses a row whenever a request ends: copying the whole buffers
        each time made a 16-sequence batch 1.11x slower (docs/benchmarks.md, session 51)."""
        index = torch.tensor(rows, dtype=torch.long)
        used, n = self._length, len(rows)
        self.lens = self.lens[index]
        self._length = int(self.lens.max()) if rows else 0
        b = bucket(max(n, 1), BATCH_BUCKETS)
        device = self.kv.device
        if b != self.kv.shape[1]:
            self._hold(_sized(self.kv[:, :, :, :used].index_select(1, index.to(device)), b, self.capacity))
            return
        first = next((i for i, r in enumerate(rows) if r != i), n)  # rows before it stay where they are
        if first < n:
            self.kv[:, first:n, :, :used] = self.kv[:, index[first:].to(device), :, :used]

    def extend(self, other: "StaticRows") -> None:
        n, m = len(self), len(other)
        self.reserve(max(self.capacity, other.capacity), n + m)
        self.kv[:, n:n + m, :, : other.capacity] = other.kv[:, :m]
        # a row may have held a request that left (select keeps padding rows as they are): none of
        # its entries stays, masked or not (a NaN would pass through a mask's finite minimum)
        self.kv[:, n:n + m, :, other.capacity:] = 0
        self.lens = torch.cat([self.lens, other.lens])
        self._length = max(self._length, other.length)


def _sized(kv: torch.Tensor, rows: int, slots: int) -> torch.Tensor:
    """[2L, b, h, s, d] -> a new contiguous [2L, rows, h, slots, d] holding kv's corner, zeros elsewhere."""
    out = kv.new_zeros(kv.shape[0], rows, kv.shape[2], slots, kv.shape[4])
    b, s = min(rows, kv.shape[1]), min(slots, kv.shape[3])
    out[:, :b, :, :s] = kv[:, :b, :, :s]
    return out


@dataclass
class CompileStats:
    graphs: int = 0        # graphs built in this process (compiled, or rebuilt from inductor's caches)
    seconds: float = 0.0   # spent building them


class _Step(torch.nn.Module):
    """One decoding step of the target: the stock decoder over the static buffers, then the LM
    head on every row. A module (not a closure) so that inductor freezes the decoder's weights."""

    def __init__(self, target, layers: tuple[int, ...] | None, lm_head: torch.nn.Module):
        super().__init__()
        self.decoder, self.lm_head, self.layers = target.decoder, lm_head, layers

    def forward(self, input_ids, mask, positions, slots, keys, values):
        out = self.decoder(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                           cache=_SlotWriter(keys, values, slots), use_cache=True,
                           output_hidden_states=self.layers is not None)
        f = out.last_hidden_state
        hidden = f if self.layers is None else torch.cat([out.hidden_states[i] for i in self.layers], dim=-1)
        return f, hidden, self.lm_head(f).float()


GQA_ATTENTION = "eaglespec_gqa"


def gqa_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """HF's attention-function contract (out [B, q, heads, d], no weights): SDPA over the key and
    value heads as they are (`enable_gqa`), not copied per query group. Anything beyond a plain
    masked attention (logit softcap, attention sinks, position bias) goes to the stock function."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    extras = kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None or kwargs.get("position_bias") is not None
    if extras or attention_mask is None or query.shape[1] % key.shape[1]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
        enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


class _Attention:
    """While a graph is traced, the module's attention layers call `gqa_attention`."""

    def __init__(self, module: torch.nn.Module):
        from transformers import AttentionInterface

        AttentionInterface.register(GQA_ATTENTION, gqa_attention)  # once: __enter__ runs on every JIT call
        self.configs = {id(c): c for m in module.modules() if hasattr(c := getattr(m, "config", None), "_attn_implementation")}
        self.saved = {}

    def __enter__(self):
        for key, config in self.configs.items():
            if config._attn_implementation == "sdpa":  # eager or flash attention stay as they are
                self.saved[key] = config._attn_implementation
                config._attn_implementation = GQA_ATTENTION
        return self

    def __exit__(self, *exc):
        for key, was in self.saved.items():
            self.configs[key]._attn_implementation = was
        self.saved.clear()


def _inductor_options(autotune: bool, package: bool = False, gemm_backends: str | None = None) -> dict:
    """Inductor's settings for a step: freezing (the weights become constants, pre-packed for its
    C++ GEMMs), max-autotune's GEMM choice among gemm_backends (None: inductor's default), and
    none of its per-GEMM tables on stderr. package: an AOTInductor package keeps its constants as
    separate tensors beside the .so (SharedConstants)."""
    options = {"freezing": True, "max_autotune": autotune, "autotune_num_choices_displayed": 0,
               "max_autotune_report_choices_stats": False}
    if autotune and gemm_backends is not None:
        options["max_autotune_gemm_backends"] = gemm_backends
    if package:
        options.update({"aot_inductor.package_constants_in_so": False,
                        "aot_inductor.package_constants_on_disk_format": "pickle_weights"})
    return options


_HOOK = threading.Lock()


@contextlib.contextmanager
def _unique_constant_names():
    """While a package is built: every constant inductor adds gets an original name of its own.

    AOTInductor keys a package's constants by their original name (the model's fqn, or the name a
    pass asked for), in weights_config.json and in `load_constants`. When a pass adds several
    different tensors under one requested name (the q/k/v weights inductor packs for its GEMMs
    become "constant66", "constant66_0", "constant66_1", all with the original name "constant66";
    torch 2.13: its C++ GEMM template prunes the plain weights it packed from the graph's constants,
    so the next unnamed constant asks for "constant<count>" again), the pickled weights keep one of
    them and loading the rest fails ("Cannot find constants constant66_0"). A tensor whose
    requested name is already taken keeps its allocated (unique) name as its original name. A
    parameter's fqn is never taken twice, so no module tensor's name changes. -> whether the hook
    is in place (False on a torch without that method: packages then keep their constants inside
    the .so)."""
    from torch._inductor.graph import GraphLowering

    allocate = getattr(GraphLowering, "allocate_non_dup_const_name", None)
    if allocate is None:
        yield False
        return

    def unique(self, name, data):
        new = allocate(self, name, data)
        original = self.allocated_constant_name.get(new)
        if original is not None and new != original and any(
                o == original for k, o in self.allocated_constant_name.items() if k != new):
            self.allocated_constant_name[new] = new
        return new

    with _HOOK:  # one build at a time may hold the hook (a server builds on its worker thread)
        GraphLowering.allocate_non_dup_const_name = unique
        try:
            yield True
        finally:
            GraphLowering.allocate_non_dup_const_name = allocate


class SharedConstants:
    """The constants of every package this process loads, held once.

    A frozen graph carries its weights: the module's own tensors and the copies inductor packed for
    its GEMMs. Inside the .so (AOTInductor's default) each package loads its own: four query sizes
    of SmolLM2-135M held 4 x 657 MB, and a generate process peaked at 6.5 GB. So packages are built
    with their constants beside the .so (`aot_inductor.package_constants_on_disk_format =
    "pickle_weights"`: data/weights/ and the model's weights_config.json, name -> file, shape,
    stride, offset) and bound here with `load_constants(user_managed=True)`, which keeps our
    pointers: a constant that names one of the module's own tensors (same shape and stride; the
    artefact key pins the dtype and the weights, a head's package name its weights) is that
    tensor, and every other constant is shared by its bytes' SHA-256 (packing depends on the
    GEMM's register blocking, which SmolLM2's 1-, 2- and 4-token graphs share here). Files are read
    with `torch.load(weights_only=True)`."""

    CONFIG = "data/aotinductor/model/weights_config.json"

    def __init__(self):
        self.tensors: dict[str, torch.Tensor] = {}   # by the SHA-256 of their pickled bytes
        self.bytes_read = 0

    def bind(self, runner, path, module: torch.nn.Module) -> None:
        import hashlib
        import io
        import json
        import zipfile

        with zipfile.ZipFile(path) as archive:
            configs = [n for n in archive.namelist() if n.endswith(self.CONFIG)]
            if not configs:
                return  # constants inside the .so
            root = configs[0][: -len(self.CONFIG)]
            own = dict(module.state_dict())
            constants, added = {}, []
            for name, (file, shape, stride, offset) in json.loads(archive.read(configs[0])).items():
                mine = own.get(name)
                if (mine is not None and list(mine.shape) == shape and list(mine.stride()) == stride
                        and offset == 0 and mine.storage_offset() == 0):
                    constants[name] = mine
                    continue
                data = archive.read(f"{root}data/weights/{file}")
                self.bytes_read += len(data)
                digest = hashlib.sha256(data).hexdigest()
                if digest not in self.tensors:
                    self.tensors[digest] = torch.load(io.BytesIO(data), weights_only=True)
                    added.append(digest)
                constants[name] = self.tensors[digest].as_strided(shape, stride, offset)
        try:
            runner.load_constants(constants, check_full_update=True, user_managed=True)
        except Exception:
            for digest in added:  # nothing else points at them
                del self.tensors[digest]
            raise


class _Package:
    """A loaded AOTInductor package, called with its inputs flattened here. torch's own wrapper
    (AOTICompiledModel) parses both of the package's call specs from JSON and walks the inputs with
    pytree on every call, about 0.1 ms: an EAGLE round makes five or six calls. Our graphs' inputs
    are tensors and lists of tensors, whose leaves pytree orders as this does."""

    def __init__(self, loader):
        self.loader = loader
        self._out_spec = _pytree.treespec_loads(loader.get_call_spec()[1])

    def __call__(self, *args):
        flat = []
        for a in args:
            if isinstance(a, torch.Tensor):
                flat.append(a)
            else:
                flat.extend(a)
        return _pytree.tree_unflatten(self.loader.boxed_run(flat), self._out_spec)


class _Jit:
    """A graph compiled in this process (torch.compile), called like a loaded package."""

    def __init__(self, module: torch.nn.Module, autotune: bool, gemm_backends: str | None = None,
                 gemm_block: gemm_kernels.GemmBlock | None = None):
        self.module = torch.compile(module, dynamic=False)
        self.autotune = autotune
        self.gemm_backends = gemm_backends
        self.attention = _Attention(module)
        weight = next(module.parameters(), None)
        self.device_type = "cpu" if weight is None else weight.device.type
        self.gemm_block = gemm_block  # the graph's (GemmBlock.at_rows), or None: inductor's own kernels

    def __call__(self, *args):
        # inductor reads `freezing` from its global config while it compiles (an `options=` entry
        # does not reach the freezing pass): patched around the call, not set for the process. Every
        # call, not only the first: dynamo reads that flag while it traces (builder.py marks the
        # parameters static by it), and whether a call traces (a guard that fails) is known only
        # inside it; a trace without the patches would build unfrozen graphs with other kernels.
        # The cost, ~55 us a call on the AMX kind, is this path's only (EAGLESPEC_COMPILE_PACKAGES=
        # off); a loaded package, the default, patches nothing per step.
        def run(backends):
            with torch._inductor.config.patch(_inductor_options(self.autotune, gemm_backends=backends)), \
                    gemm_kernels.micro_gemms(self.device_type, self.gemm_block), self.attention:
                return self.module(*args)

        out, self.gemm_backends = gemm_kernels.gemm_fallback(run, self.gemm_backends)  # None from then on, if it fell back
        return out


class _HeadStep(torch.nn.Module):
    """One forward of the draft head (EAGLE-1 or EAGLE-3) over its static buffers. The token
    embeddings come in from outside: a lookup costs nothing eagerly, and frozen into the graph the
    target's embedding table would be copied into every package."""

    def __init__(self, head):
        super().__init__()
        self.head = head

    def forward(self, embeds, hidden, mask, positions, slots, keys, values):
        return self.head(embeds, hidden, attention_mask=mask, position_ids=positions, cache=_SlotWriter(keys, values, slots))


class _DraftScores(torch.nn.Module):
    """The draft's LM head (DraftLM.logprobs: log q over the draft vocabulary) as a module, so that
    its matrix is frozen and pre-packed for inductor's GEMM like the head's own: eager, this one
    product cost more than the head's whole layer (1.5 ms for SmolLM2's 8,192 x 576 at one node, 4
    ms at two to four, against 0.4-0.6 ms compiled)."""

    def __init__(self, lm):
        super().__init__()
        self.norm = lm.norm
        self.weight = torch.nn.Parameter(lm.weight, requires_grad=False)
        self.bias = None if lm.bias is None else torch.nn.Parameter(lm.bias, requires_grad=False)

    def forward(self, out):
        from ..draft.contract import draft_logprobs

        return draft_logprobs(self.norm, self.weight, self.bias, out)


def _step_inputs(rows: "StaticRows", b: int, n: int, q: int, base: int, block: torch.Tensor, dtype, device):
    """The mask and write slots of a step of n real queries (padded to q) per row, appended at
    rows.length: row r's query i sees row r's entries before `base` and block[r, i] (over the slots
    [base, length + n)); padding queries see only their own slot. -> (additive mask [rows bucket,
    1, q, capacity], 0 = attend, dtype-min = blocked, as core.attention.additive_mask; slots [q]).
    Written into the mask in place: a drafting round builds four of them, and each op is ~10 us."""
    start = rows.length
    rows.reserve(start + q, b)
    rb, cap = rows.kv.shape[1], rows.capacity
    mask = torch.full((rb, 1, q, cap), torch.finfo(dtype).min, dtype=dtype, device=device)
    own = mask[:, 0, :, start:start + q]  # [rb, q, q]: padding queries and rows see their own slot
    own[:, n:, n:].diagonal(dim1=1, dim2=2).zero_()
    if rb > b:
        own[b:, :n, :n].diagonal(dim1=1, dim2=2).zero_()
    if b == 1:
        mask[0, 0, :n, : min(int(rows.lens[0]), base)] = 0
    else:
        mask[:b, 0, :n, :base].masked_fill_(rows.valid(base, device)[:, None, :], 0)
    mask[:b, 0, :n, base:start + n].masked_fill_(block.to(device), 0)
    return mask, torch.arange(start, start + q, device=device)


def _padded(t: torch.Tensor, rows: int, q: int) -> torch.Tensor:
    """[b, n, ...] -> [rows, q, ...], zeros after (t itself when it has that shape)."""
    if t.shape[0] == rows and t.shape[1] == q:
        return t
    out = t.new_zeros((rows, q, *t.shape[2:]))
    out[: t.shape[0], : t.shape[1]] = t
    return out


def _dtype_suffix(dtype: torch.dtype, target) -> str:
    """'' for the target's dtype (the folder's), else '-bfloat16' and the like."""
    return "" if dtype == target.dtype else "-" + str(dtype).removeprefix("torch.")


class CompiledHeadSteps:
    """The draft head's forward compiled like the target's (drafter.EagerHeadSteps' interface):
    a static cache for the head's layers (one, but for an EAGLE-1 head of more), queries and rows padded to buckets. A step wider than
    EAGER_QUERIES, or an absorb wider than the drafter's (a joining prompt's pairs), runs the same
    module eagerly over the same buffers."""

    def __init__(self, owner: "CompiledSteps", head, target):
        self.owner, self.head, self.target = owner, head, target
        cfg = head.cache_config
        self.layers, self.heads = cfg.num_hidden_layers, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.dtype = next(head.parameters()).dtype
        self.module = _HeadStep(head).eval()
        # packages are named by the head's weights: another head of the same kind (a retrained or a
        # new shipped one) must never load this one's frozen weights. The digest reads values, not
        # dtypes, and the folder is the target's dtype: a head run in another one (bf16 weights in
        # an fp32 folder, an experiment's) is named apart, or its packages would be loaded for the
        # same weights cast back, and fail on their constants' dtype.
        self.tag = f"h{head.kind}-{owner.digest(head)}{_dtype_suffix(self.dtype, target)}"
        self._scores: tuple[object, str, _DraftScores] | None = None  # (lm, its tag, module)

    def new_rows(self, rows: int, slots: int = 0) -> StaticRows:
        """slots: the most the rows will hold (a sequence's prompt, budget and tree), so that its
        head cache, like the target's, is sized once and never changes bucket (and graphs)
        mid-generation."""
        return StaticRows.empty(self.layers, self.heads, self.head_dim, rows, self.dtype, self.target.device, slots)

    @torch.no_grad()
    def forward(self, rows: StaticRows, base: int, tokens, hidden, block, positions, pad_to: int = 0) -> torch.Tensor:
        """tokens [B, M], hidden [B, M, H], block [B, M, A] over the slots appended since `base`
        (this call's M last), positions [B, M] -> head outputs [B, M, H]; the cache grows by M.
        pad_to: run at least this many queries (the drafter's widest absorb), so that one graph
        serves every width up to it; an absorb wider than that (a joining prompt's pairs, pairs
        gathered over vanilla steps) runs eagerly, as does any step wider than EAGER_QUERIES: their
        widths vary with the request, and a graph each would be built while serving."""
        b, m = tokens.shape
        device = self.target.device
        assert rows.length == base + block.shape[2] - m, "head-cache slots must be appended in order"
        eager = m > EAGER_QUERIES or 0 < pad_to < m
        q = m if eager else bucket(max(m, pad_to), QUERY_BUCKETS)
        mask, slots = _step_inputs(rows, b, m, q, base, block, self.dtype, device)
        rb = rows.kv.shape[1]
        embeds = self.target.embed_tokens(_padded(tokens.to(device), rb, q)).to(self.dtype)
        args = (embeds, _padded(hidden.to(self.dtype), rb, q), mask,
                _padded(positions.to(device), rb, q), slots, rows.keys, rows.values)
        if eager:
            out = self.module(*args)
        else:
            out = self.owner._runner((rb, q, rows.capacity, self.tag), args, self.module, "the draft head's step")(*args)
        rows._length = base + block.shape[2]
        return out[:b, :m]

    @torch.no_grad()
    def logprobs(self, lm, out: torch.Tensor) -> torch.Tensor:
        """lm.logprobs on the compiled path: head outputs [B, E, H] -> [B, E, Vd] log q, one graph
        per (rows, nodes) bucket and draft LM head (named by its weights: a draft vocabulary)."""
        b, e = out.shape[:2]
        if e > EAGER_QUERIES:
            return lm.logprobs(out)
        if self._scores is None or self._scores[0] is not lm:
            module = _DraftScores(lm).eval()
            # the target's own LM head (no draft vocabulary) is named by the folder's key already
            whole = lm.weight.data_ptr() == self.target.lm_head.weight.data_ptr()
            named = "target" if whole else self.owner.digest(module) + _dtype_suffix(lm.weight.dtype, self.target)
            self._scores = (lm, f"d{self.head.kind}-{named}", module)
        _, tag, module = self._scores
        rb, q = bucket(b, BATCH_BUCKETS), bucket(e, QUERY_BUCKETS)
        args = (_padded(out.to(self.dtype), rb, q),)
        return self.owner._runner((rb, q, 0, tag), args, module, "the draft's LM head")(*args)[:b, :e]


class CompiledSteps:
    """The target's decoding steps compiled, one graph per (rows, tokens, cache) bucket and set of
    fused layers; the interface of target.EagerSteps.

    With a folder, each graph is an AOTInductor package there (`step-<rows>x<tokens>x<slots>
    -<layers>.pt2`), built once and loaded in well under a second by later starts. Why packages
    and not inductor's FX graph cache: freezing turns the weights into pre-packed (mkldnn)
    constants, which that cache refuses to store ("mkldnn tensors unpickleable"), so every start
    would compile again (about 2 minutes a graph here). A graph that cannot be exported (a
    mixture-of-experts layer's data-dependent routing) is compiled in-process instead, said so."""

    name = "compiled"
    builds_steps = True  # each step is a graph built or loaded on first use: EagleGenerator.warm does it at start
    # the query sizes whose batch invariance gates --tree auto here (numerics.numerics_for)
    invariance_sizes = tuple(b for b in QUERY_BUCKETS if b <= AUTO_TOKENS)

    @property
    def kernels(self) -> str:
        """What a cached measurement of this path's steps depends on (the artefacts' scheme, and on
        a CPU the micro-GEMM block of their GEMMs)."""
        block = gemm_kernels.gemm_block(self.target.device)
        return f"{self.name}-{ARTEFACT_SCHEME}" + (f"-{block}" if block else "")

    def __init__(self, target, progress: bool = True, autotune: bool = True, folder=None):
        """autotune: inductor's max-autotune GEMM choice (off only in tests, where tiny models
        compile faster without it). folder: where packages are kept (None: in-process graphs)."""
        self.target = target
        self.progress = progress
        self.autotune = autotune
        self.folder = folder
        self.stats = CompileStats()
        self.constants = SharedConstants()
        self._runners: dict[tuple, object] = {}
        self._untied: torch.nn.Module | None = None
        self._digests: dict[tuple, str] = {}  # weights_digest by the module's tensors (a drafter per tree asks again)
        # a fixed, small set of graphs per process; dynamo's default limit of 8 would fall back to eager
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
        torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, 1024)

    def start_rows(self, cache, lens: list[int], slots: int) -> StaticRows:
        return StaticRows.from_dynamic(cache, lens, slots)

    @staticmethod
    def cache_bucket(slots: int) -> int:
        """The static cache size a sequence of `slots` slots runs in (a set of graphs per size)."""
        return bucket(slots, CACHE_BUCKETS)

    def tree_sizes(self, sizes: tuple[int, ...]) -> tuple[int, ...]:
        """Of the draft-node counts --tree auto may measure, those whose tree (root included) fills a
        query bucket up to AUTO_TOKENS: a smaller tree costs the same padded step and accepts less,
        and every size measured is a graph to build."""
        return tuple(b - 1 for b in QUERY_BUCKETS if 2 <= b <= AUTO_TOKENS and sizes and b - 1 <= max(sizes))

    def _say(self, text: str) -> None:
        if self.progress:
            print(f"[eaglespec] {text}", file=sys.stderr, flush=True)

    def _lm_head(self) -> torch.nn.Module:
        """The LM head the compiled step applies. With tied embeddings, a copy of its own: freezing
        leaves a weight the embedding lookup also reads as it is, and that LM head then runs on
        MKL's few-row GEMM (2-4x slower at 2-8 rows than at one); the copy is pre-packed for
        inductor's GEMM like every other matrix (one copy per process: 113 MB for SmolLM2)."""
        lm = self.target.lm_head
        if lm.weight.data_ptr() != self.target.embed_tokens.weight.data_ptr():
            return lm
        if self._untied is None:
            self._untied = torch.nn.Linear(lm.in_features, lm.out_features, bias=lm.bias is not None,
                                           device=lm.weight.device, dtype=lm.weight.dtype)
            self._untied.load_state_dict(lm.state_dict())
            self._untied.requires_grad_(False)
        return self._untied

    def digest(self, module: torch.nn.Module) -> str:
        """weights_digest(module), once per set of tensors (by their storage, shape and dtype)."""
        key = tuple((name, t.data_ptr(), tuple(t.shape), t.dtype) for name, t in module.state_dict().items())
        if key not in self._digests:
            self._digests[key] = weights_digest(module)
        return self._digests[key]

    def head_steps(self, head) -> CompiledHeadSteps:
        return CompiledHeadSteps(self, head, self.target)

    def _runner(self, key: tuple, args: tuple, module: torch.nn.Module | None = None, what: str = "the target's step"):
        runner = self._runners.get(key)
        if runner is None:
            began = time.perf_counter()
            runner = self._runners[key] = self._build(key, args, module or _Step(self.target, key[3], self._lm_head()), what)
            self.stats.graphs += 1
            self.stats.seconds += time.perf_counter() - began
        return runner

    def _gemm_backends(self, rows: int, q: int) -> str | None:
        """The GEMM backends max-autotune chooses among for a step of rows x q tokens (None: all)."""
        cpu = self.target.device.type == "cpu"
        return gemm_kernels.CPU_GEMM_BACKENDS if cpu and rows * q <= gemm_kernels.CPU_TEMPLATE_ROWS else None

    def _build(self, key: tuple, args: tuple, module: torch.nn.Module, what: str):
        rows, q, cap, layers = key
        backends = self._gemm_backends(rows, q)
        cpu = self.target.device.type == "cpu"
        block = gemm_kernels.cpu_gemm_block().at_rows(rows * q) if cpu else None
        what = f"{what} for {rows} row(s) x {q} token(s)" + (f" x {cap} cache slots" if cap else "")
        module = module.eval()
        if self.folder is None:
            self._say(f"compiling {what} (in this process)")
            return _Jit(module, self.autotune, backends, block)
        tag = layers if isinstance(layers, str) else "f" if layers is None else "l" + "-".join(map(str, layers))
        path = self.folder / f"step-{rows}x{q}x{cap}-{tag}{'' if self.autotune else '-noautotune'}.pt2"
        if path.is_file():
            try:
                return self._load(path, module)
            except Exception as exc:  # a damaged or foreign file: rebuilt
                self._say(f"note: ignored the compiled package {path} ({one_line(exc)}); building it again")
                path.unlink(missing_ok=True)
        began = time.perf_counter()
        self._say(f"compiling {what}: 1-3 minutes on a 2-core CPU, once (kept in {path.parent})")
        try:
            with _Attention(module):
                # the cache's buffers are views of one tensor (StaticRows.kv): traced as separate
                # tensors, as the package will treat them
                program = torch.export.export(module, tuple([t.clone() for t in a] if isinstance(a, list) else a
                                                            for a in args), strict=False)
        except Exception as exc:  # data-dependent shapes (MoE routing) do not export
            self._say(f"note: {what} cannot be exported ({one_line(exc, 120)}); compiled in this process instead")
            return _Jit(module, self.autotune, backends, block)
        partial = path.with_name(f".{path.stem}.{os.getpid()}.partial.pt2")  # never read: renamed when whole
        try:
            runner = self._package_and_bind(program, partial, path, module, backends, block)
        except Exception as exc:
            raise CompileFailed(what, path.parent, exc) from exc
        finally:
            partial.unlink(missing_ok=True)
        self._say(f"  built in {time.perf_counter() - began:.0f} s")
        return runner if runner is not None else self._load(path, module)

    def _package_and_bind(self, program, partial, path, module, backends, block):
        """Build `program`'s package at `partial`, then rename it to `path` -> its loaded runner
        when its constants could be kept beside it and bound (else None: load `path`)."""
        runner = None
        try:  # constants beside the .so, shared; bound before the package is kept
            with _unique_constant_names() as apart:
                if apart:
                    self._package(program, partial, True, backends, block)
                    runner = self._load(partial, module)
        except Exception as exc:
            if disk_full(exc) is not None:  # building it again cannot help
                raise
            # e.g. oneDNN's packed weights (opaque tensors: max-autotune's pick for some shapes)
            # cannot be pickled; inside the .so they load unshared (the graph is built again, once)
            self._say(f"  its constants cannot be kept beside it ({one_line(exc, 100)}): "
                      "building it again with them inside (this graph's weights are not shared)")
        if runner is None:
            self._package(program, partial, False, backends, block)
        os.replace(partial, path)
        return runner

    def _package(self, program, path, apart: bool, backends: str | None, block) -> None:
        def build(choice):
            with torch._inductor.config.patch(_inductor_options(self.autotune, apart, choice)), \
                    gemm_kernels.micro_gemms(self.target.device.type, block):
                torch._inductor.aoti_compile_and_package(program, package_path=str(path))

        gemm_kernels.gemm_fallback(build, backends, lambda exc: self._say(
            f"  a GEMM has no C++ template kernel ({one_line(exc, 100)}): building it again with "
            "inductor's default choice of GEMMs"))

    def _load(self, path, module: torch.nn.Module):
        runner = torch._inductor.aoti_load_package(str(path))
        self.constants.bind(runner, path, module)
        return _Package(runner.loader)

    @torch.no_grad()
    def verify_rows(self, input_ids, rows: StaticRows, tree_mask, depth, sizes: list[int], layers=None):
        """target.EagerSteps.verify_rows on the compiled path: input_ids [B, N], tree_mask [B, N, N],
        depth [B, N] -> (TargetStates [B, N, ...], logits of each row's first sizes[r] nodes)."""
        from .target import TargetStates

        b, n = input_ids.shape
        q = bucket(n, QUERY_BUCKETS)
        start, device = rows.length, self.target.device
        mask, slots = _step_inputs(rows, b, n, q, start, tree_mask, self.target.dtype, device)
        rb, cap = rows.kv.shape[1], rows.capacity
        positions = rows.lens.to(device)[:, None] + depth.to(device)
        args = (_padded(input_ids.to(device), rb, q), mask, _padded(positions, rb, q), slots, rows.keys, rows.values)
        f, hidden, logits = self._runner((rb, q, cap, layers), args)(*args)
        rows._length = start + n  # as a DynamicCache grows by the step's tokens (keep_paths then compacts)
        return TargetStates(f[:b], hidden[:b]), [logits[r, :s] for r, s in enumerate(sizes)]


COMPILE_ENV = "EAGLESPEC_COMPILE"  # the default of --compile / compile=None (the tests set it to off)
# off: each graph compiled in-process by torch.compile (no package kept, every start compiles
# again; inductor's own caches still go to the artefact folder) instead of an AOTInductor package: the other way to try the compiled path on CUDA, where
# building a package crashed (docs/gpu.md)
PACKAGES_ENV = "EAGLESPEC_COMPILE_PACKAGES"


def compile_mode(mode: str | None, quantize: str | None = None) -> str:
    """compile=None -> $EAGLESPEC_COMPILE, else 'auto'; checked. A quantized target stays eager
    under 'auto' (its int8 kernel is not one inductor's GEMM templates replace) and is refused
    under 'on'."""
    mode = mode if mode is not None else os.environ.get(COMPILE_ENV, "auto") or "auto"
    if mode not in MODES:
        raise EagleError(f"--compile {mode!r}: choose auto, on or off")
    if quantize not in (None, "none") and mode == "on":
        raise EagleError(f"--compile on with --quantize {quantize}: the compiled path runs float weights; "
                         "drop one of the two")
    return "off" if quantize not in (None, "none") else mode


def use_compiled(target, mode: str = "auto", progress: bool = True, tokens: int | None = None,
                 rows: int | None = None) -> str:
    """Give `target` the compiled step when `mode` (auto | on | off), this machine and the largest
    tree (`tokens`) and batch (`rows`) to run allow it, with inductor's caches in the artefact
    folder (`artefact_dir`); returns what was chosen and why, for the user."""
    on, why = resolve_mode(mode, target.device, tokens, rows)
    if on:
        folder, note = artefact_dir(target)
        if os.environ.get(PACKAGES_ENV, "on").strip().lower() in ("off", "0", "no", "false") and folder is not None:
            note = "; ".join(n for n in (note, f"graphs compiled in this process, no packages kept ({PACKAGES_ENV}=off)") if n)
            folder = None
        target.steps = CompiledSteps(target, progress, folder=folder)
        why = f"{why}; {note}" if note else why
        if folder is not None:
            why += f"; artefacts in {folder}"
    return why


# -- the artefact cache -------------------------------------------------------------------------
_SET_BY_US: set[str] = set()  # TORCHINDUCTOR_CACHE_DIR values this module chose


def artefact_key(target) -> dict:
    """What a compiled step depends on, besides the shapes inductor keys on itself: the machine
    (CPU model and matrix flags, or the GPU), threads, the software, the target's weights and dtype,
    and on a CPU the micro-GEMM block of its fp32 GEMMs (gemm_kernels.cpu_gemm_block)."""
    from .target import cpu_identity

    device = target.device
    return {"scheme": ARTEFACT_SCHEME, **cpu_identity(), "device": str(device),
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "threads": torch.get_num_threads(), **installed_versions(),
            "target": target.fingerprint(), "dtype": str(target.dtype).removeprefix("torch."),
            "gemm_block": gemm_kernels.gemm_block(device)}


PARTIAL_MAX_AGE_S = 3600  # a half-written package untouched this long, its writer gone, is dead weight


def _remove_dead_partials(folder) -> str:
    """Delete the half-written packages (`.<name>.<pid>.partial.pt2`, hundreds of MB each) that a
    compile killed outright (SIGKILL, a power cut) left behind: those whose process is not alive
    here and which have not changed for PARTIAL_MAX_AGE_S (the pid alone cannot tell: a folder
    shared between containers or machines sees other namespaces' writers). -> a note, or ''."""
    removed = freed = 0
    for path in folder.glob(".*.partial.pt2"):
        try:
            os.kill(int(path.name.split(".")[-3]), 0)
            continue  # its writer is alive
        except (ValueError, IndexError, ProcessLookupError, OverflowError):
            pass  # no such process here (or a name not ours)
        except PermissionError:
            continue  # alive, another user's
        with contextlib.suppress(OSError):
            stat = path.stat()
            if time.time() - stat.st_mtime < PARTIAL_MAX_AGE_S:
                continue  # perhaps another namespace's compile in progress
            path.unlink()
            removed, freed = removed + 1, freed + stat.st_size
    if not removed:
        return ""
    return f"note: removed {removed} half-written compiled package(s) an interrupted compile left ({freed / 1e6:.0f} MB)"


def artefact_dir(target, root=None) -> tuple[object, str]:
    """The folder of this target's compiled packages: <cache folder>/compiled/<hash of
    artefact_key>/, with inductor's scratch caches (generated code, built kernels, autotuning
    choices) in its inductor/ unless the user set TORCHINDUCTOR_CACHE_DIR. A folder whose manifest
    is unreadable or made under another key is emptied and rebuilt, and said so; packages are
    written under a temporary name and renamed when whole, so an interrupted compile leaves
    nothing a later start would load, and the temporary files of a killed one are removed here.
    -> (folder, or None when it cannot be written; note)."""
    import hashlib
    import json
    from pathlib import Path

    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from ..files import atomic_write_bytes, cache_dir

    key = artefact_key(target)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    folder = Path(root or cache_dir()) / "compiled" / digest
    manifest = folder / MANIFEST
    note = ""
    if folder.exists():
        try:
            trusted, why = json.loads(manifest.read_text()).get("key") == key, "made under another key"
        except (OSError, UnicodeDecodeError, ValueError, AttributeError) as exc:
            trusted, why = False, f"its manifest is unreadable ({type(exc).__name__})"
        if not trusted:
            shutil.rmtree(folder, ignore_errors=True)
            note = f"note: ignored the compiled-artefact cache {folder} ({why}); rebuilding it"
        else:
            note = _remove_dead_partials(folder)
    try:
        (folder / "inductor").mkdir(parents=True, exist_ok=True)
        if not manifest.is_file():  # a new folder: after an upgrade, the old ones are dead weight
            atomic_write_bytes(manifest, json.dumps({"key": key}, indent=1).encode())
            note = "; ".join(n for n in (note, stale_note(root)) if n)
    except OSError as exc:
        return None, f"compiled graphs not kept: {folder} is not writable ({exc.strerror}); set EAGLESPEC_CACHE"
    env = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    users = env and env not in _SET_BY_US and os.path.abspath(env) != os.path.abspath(default_cache_dir())
    path = str(folder / "inductor")
    if not users and env != path:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
        _SET_BY_US.add(path)
        from torch._inductor.utils import clear_caches

        clear_caches()  # inductor's in-memory caches point at the old folder
    return folder, note
