"""Inductor's C++ micro-GEMMs on a CPU, as the compiled steps build them: which backends
max-autotune may choose among for a narrow step, how many rows a micro-kernel holds in registers,
and a software prefetch of the weights (patches of inductor's micro-GEMM table and kernel template,
held only while a graph is built, restored afterwards, and named in the graph caches' keys).

Every rule here was measured (docs/benchmarks.md; `python -m eaglespec.bench.gemm` times the
blocks side by side and compares their products bit for bit). None changes a result: each output's
sum runs over k in the same order with any block, and a prefetch changes no arithmetic.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .compiled_cache import ARTEFACT_SCHEME

# On a CPU, max-autotune chooses the GEMMs of a step of up to CPU_TEMPLATE_ROWS rows (a vanilla
# step, a head's step, the verification of trees of up to 8 tokens) among inductor's C++ templates
# alone. Left to choose, it times each GEMM in a loop over the same weights, which then sit in the
# caches, and picks oneDNN's packed product, which in a real step (the weights streamed from memory)
# is slower. Measured side by side on the AVX-512 kind (docs/benchmarks.md): a vanilla step of
# SmolLM2-135M took 19.3 and 24.0 ms with its oneDNN products, 15.0 and 18.5 ms with the templates;
# an 8-token step (templates of 4 register rows, below) 30.3 and 31.7 ms against 35.9 and 36.1 for
# autotune's mix. Wider steps (batches) keep its own choice.
CPU_TEMPLATE_ROWS = 8
CPU_GEMM_BACKENDS = "CPP"


# On a CPU with AVX-512, inductor's fp32 micro-GEMM holds a block of 8 rows x 48 columns in
# registers (24 accumulators), and at 8 rows it ran 1.3-2x slower than a 4-row block: measured on
# the AVX-512 kind (docs/benchmarks.md, "An 8-token step at 4 register rows"), 120 products of
# 576 x 1536 weights streamed from memory took 28.7 ms at 8 rows with the 8-row block, 21.4 ms with
# a 4-row block (11.8 and 11.4 at 1 row; `python -m eaglespec.bench.gemm`); an 8-row panel of
# weights is then read twice, the second time from L1. On the Intel AMX kind the 4-row block was
# steep as well and a 2-row block flatter (15.6 / 17.3 / 24.7 / 31.5 ms at 1 / 2 / 4 / 8 rows with
# 4, 15.6 / 17.4 / 19.4 / 22.8 with 2), until the weights were prefetched (below). Each output's
# sum runs over k in the same order with any block, so the block changes no result (the command
# compares them bit for bit). AVX2's table (4 rows, and 8 x 8 where N divides by 8 only) is left
# as it is.
#
# A product of more than one row costs more than a 1-row one, at the same bytes read, most likely
# because the core doing more arithmetic per byte keeps fewer loads in flight and the hardware
# prefetcher alone does not hold the DRAM bandwidth (no counters on these machines to show it).
# On the Intel AMX kind (family 6 model 167) a software prefetch of the weights 32 k-rows ahead
# into L2 (prefetcht1, one per 64-byte vector of the panel) made a 4-row block cheap again
# (docs/benchmarks.md, "Prefetching the weights"): whole steps of SmolLM2-135M, one process,
# q = 1 / 2 / 4 / 8 tokens, 24.1 / 26.7 / 30.9 / 34.7 ms with 2-row blocks and no prefetch,
# 22.5 / 23.4 / 25.9 / 31.0 with 2 rows and the prefetch, 22.6 / 22.8 / 24.5 / 31.1 with 4 rows
# and the prefetch (8 rows: 33.0 at q = 8). A prefetch changes no arithmetic. So Intel CPUs block
# 4 rows and prefetch where inductor builds AVX-512 kernels (measured on that one Intel kind).
# On the Zen 4 kind (AMD family 25) the same prefetch helps only the widest template steps
# (docs/benchmarks.md, "The weights' prefetch on the Zen 4 kind"): five runs of whole steps side by
# side, q = 8 took 24.8-27.9 ms with it against 27.3-30.9 without (4-15% less in every run), q = 1
# the same either way (0.2 ms apart or less in the longer runs), q = 2 and 4 0-2.7 ms more with
# it. So AMD CPUs block 4 rows and prefetch in graphs of 5 rows or more (prefetch_rows; AMD's
# family-26 kind, where 4 rows were measured, was not measured with a prefetch). Other vendors:
# 4 rows, no prefetch.


@dataclass(frozen=True)
class GemmBlock:
    """How inductor builds the fp32 micro-GEMMs of a step on this CPU."""

    rows: int          # the most rows a micro-kernel holds in registers
    prefetch: int = 0  # how many k-rows of weights ahead each k-step prefetches into L2 (0: none)
    prefetch_rows: int = 1  # the prefetch goes only into the GEMMs of graphs of at least this many rows

    def __post_init__(self):
        # type(x) is int: a bool (or numpy integer) would pass isinstance and print apart ("rTrue") in keys
        if not (type(self.rows) is int and self.rows >= 1):
            raise ValueError(f"a micro-GEMM block's rows are a whole number (int), 1 or more, got {self.rows!r}")
        if not (type(self.prefetch) is int and self.prefetch >= 0):
            raise ValueError(f"a micro-GEMM block's prefetch is a whole number (int) of k-rows, 0 (none) or more, "
                             f"got {self.prefetch!r}")
        if not (type(self.prefetch_rows) is int and self.prefetch_rows >= 1):
            raise ValueError(f"a micro-GEMM block's prefetch_rows is a whole number (int) of rows, 1 or more, "
                             f"got {self.prefetch_rows!r}")

    def __str__(self) -> str:
        prefetch = f"-p{self.prefetch}" + (f"-m{self.prefetch_rows}" if self.prefetch_rows > 1 else "")
        return f"r{self.rows}" + (prefetch if self.prefetch else "")

    def at_rows(self, m: int) -> GemmBlock:
        """The block a graph whose GEMMs have m rows (tokens x sequences) is built with: without the
        prefetch below prefetch_rows rows; it names what that graph holds (in its cache key)."""
        if not self.prefetch or m >= self.prefetch_rows:
            return dataclasses.replace(self, prefetch_rows=1) if self.prefetch else self
        return GemmBlock(self.rows)


CPU_GEMM_BLOCKS = {  # by /proc/cpuinfo's vendor_id; the artefacts' key holds it
    "GenuineIntel": GemmBlock(4, 32),
    "AuthenticAMD": GemmBlock(4, 32, prefetch_rows=5),  # measured on the Zen 4 kind (family 25), above
}
CPU_GEMM_BLOCK_DEFAULT = GemmBlock(4)


def cpu_gemm_block() -> GemmBlock:
    """The micro-GEMM block inductor's fp32 GEMMs are built with on this CPU (a graph of m rows:
    `.at_rows(m)`); no prefetch where it builds other than AVX-512 kernels (measured with those
    only) or this torch's micro-GEMM template cannot take one."""
    from .target import cpu_vendor

    block = CPU_GEMM_BLOCKS.get(cpu_vendor(), CPU_GEMM_BLOCK_DEFAULT)
    return block if not block.prefetch or _avx512_prefetch() else GemmBlock(block.rows)


def gemm_block(device: torch.device) -> str | None:
    """What the compiled artefacts and cached measurements of a device key on for the GEMMs' micro-
    kernels: cpu_gemm_block() on a CPU ("r4-p32"), None elsewhere."""
    return str(cpu_gemm_block()) if device.type == "cpu" else None


_MICRO = threading.RLock()  # one thread patches inductor's micro-GEMMs at a time
_HELD = threading.local()   # .block: the block this thread's outermost micro_gemms holds
_LOAD_B = "            vb[col] = Vectorized::loadu(B + k * ldb + col * VLEN);\n"  # fp32 B, no tail


def _micro_gemm():
    """Inductor's micro-GEMM module, or None in a torch without one."""
    try:
        import torch._inductor.compile_fx  # noqa: F401  (inductor's modules import in this order)
        from torch._inductor.codegen import cpp_micro_gemm as micro
    except ImportError:
        return None
    return micro


def _micro_gemm_table():
    """(inductor's fp32 micro-GEMM table, its module), or None in a torch without one."""
    micro = _micro_gemm()
    try:
        configs = micro.micro_gemm_configs[micro.CppMicroGemmFP32Vec]
    except (AttributeError, KeyError):
        return None
    return (configs, micro) if configs else None


@functools.cache
def prefetch_line() -> str | None:
    """The line of inductor's fp32 micro-GEMM kernel template that loads a vector of weights (once
    in it), after which a prefetch goes; None in a torch whose template differs."""
    micro = _micro_gemm()
    template = getattr(getattr(micro, "CppMicroGemmFP32Vec", None), "TEMPLATE_KERNEL", None)
    return _LOAD_B if isinstance(template, str) and template.count(_LOAD_B) == 1 else None


@functools.cache
def _avx512_prefetch() -> bool:
    """Whether a block's prefetch takes effect here: inductor builds AVX-512 kernels on this CPU and
    its table and template can be patched."""
    from torch._inductor.cpu_vec_isa import VecAVX512, pick_vec_isa

    return isinstance(pick_vec_isa(), VecAVX512) and prefetch_line() is not None and _micro_gemm_table() is not None


def prefetch_code(distance: int) -> str:
    """The line a fp32 micro-GEMM kernel gets after each load of a vector of weights: a prefetch into
    L2 (prefetcht1) of the vector `distance` k-rows ahead; a prefetch never faults, so one past the
    panel's end is harmless."""
    return f"            __builtin_prefetch(B + (k + {distance}) * ldb + col * VLEN, 0, 2);\n"


@functools.cache
def _with_prefetch(template: str, distance: int) -> str:
    return template.replace(_LOAD_B, _LOAD_B + prefetch_code(distance))


@functools.cache
def _block_key(block: GemmBlock):
    """A post-grad pass that does nothing but put the micro-GEMM block in inductor's graph-cache key
    (its cache keys on its config, not on the micro-GEMM table or template): a graph cached with one
    block, or under another artefact scheme, is never served to a build with another."""
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class Block(CustomGraphPass):
        def __call__(self, graph) -> None:
            pass

        def uuid(self):
            return f"eaglespec-gemm-{block}-{ARTEFACT_SCHEME}"

    return Block()


@contextlib.contextmanager
def micro_gemms(device_type: str, block: GemmBlock | None = ...):
    """While inductor builds a graph on a CPU: its fp32 AVX-512 micro-GEMMs block at most
    block.rows rows, and its fp32 micro-GEMM kernels prefetch the weights block.prefetch k-rows
    ahead into L2, whatever the graph's rows (the caller passes `block.at_rows(m)` for a graph of m
    rows; default cpu_gemm_block(); patches of its table of micro-kernel shapes and of its
    kernel template, restored afterwards; None, or a torch without them: its own kernels). VecAMX's
    own shapes (bf16, int8) are not changed; fp32 on an AMX machine runs the AVX-512 ones. A nested
    use keeps the outer one's block."""
    if device_type != "cpu" or block is None or getattr(_HELD, "block", None) is not None:
        yield
        return
    found = _micro_gemm_table()
    if found is None:
        yield
        return
    block = cpu_gemm_block() if block is ... else block
    if prefetch_line() is None:  # the key names only what is built
        block = GemmBlock(block.rows)
    configs, micro = found
    blocking = type(configs[0].register_blocking)
    kernel = micro.CppMicroGemmFP32Vec

    def fewer_rows(c):
        if c.vec_isa_cls is not micro.VecAVX512 or c.input_dtype != torch.float32 \
                or c.register_blocking.block_m <= block.rows:
            return c
        return dataclasses.replace(c, register_blocking=blocking(block.rows, *c.register_blocking[1:]))

    with _MICRO, torch._inductor.config.patch(post_grad_custom_post_pass=_block_key(block)):
        saved, template = list(configs), kernel.TEMPLATE_KERNEL
        configs[:] = [fewer_rows(c) for c in configs]
        if block.prefetch:
            kernel.TEMPLATE_KERNEL = _with_prefetch(template, block.prefetch)
        _HELD.block = block
        try:
            yield
        finally:
            _HELD.block = None
            configs[:] = saved
            kernel.TEMPLATE_KERNEL = template



def _no_gemm_choice(exc: BaseException) -> bool:
    """Whether a compile failed because some GEMM had no kernel among the allowed backends (a
    shape or dtype the C++ templates do not cover): then it is built again with inductor's default."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if type(exc).__name__ == "NoValidChoicesError" or "No choices to select" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def gemm_fallback(build: Callable[[str | None], object], backends: str | None,
                  say: Callable[[BaseException], None] | None = None) -> tuple[object, str | None]:
    """build(backends), and where some GEMM has no kernel among them (`_no_gemm_choice`) build(None),
    inductor's default choice (said through `say`) -> (what it built, the backends it was built with)."""
    for choice in dict.fromkeys([backends, None]):
        try:
            return build(choice), choice
        except Exception as exc:
            if choice is None or not _no_gemm_choice(exc):
                raise
            if say is not None:
                say(exc)
    raise AssertionError("unreachable: the last choice, None, returns or raises")
