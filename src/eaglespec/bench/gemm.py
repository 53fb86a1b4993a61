"""Inductor's C++ GEMM templates at a few rows, for each micro-GEMM block: products of a decoder's
shape with their weights streamed from memory, as a decoding step streams them.

A stack of `--products` products of `--shape` (default: SmolLM2-135M's MLP, 576 x 1536, 120 of
them: 425 MB of fp32 weights, far more than the caches hold) is built as an AOTInductor package
with frozen weights and the C++ templates alone (gemm_kernels.CPU_GEMM_BACKENDS), once for each row
count and block (`--blocks`: `R` holds at most R rows in registers, `RpD` also prefetches the
weights D k-rows ahead into L2, `RpDmM` only at M rows or more, as gemm_kernels.cpu_gemm_block()
chooses; `inductor`: inductor's own table; `any`: max-autotune's own pick among all its GEMM
backends, oneDNN's included, as a step wider than gemm_kernels.CPU_TEMPLATE_ROWS is built). All
are then timed in shuffled interleaved
rounds in one process (medians), so a machine shared with other work slows them alike. It
measured the rules behind gemm_kernels.CPU_GEMM_BLOCKS (docs/benchmarks.md). Each package keeps its
weights inside its .so: the defaults hold 12 x 425 MB in memory, and as much in a temporary
folder while they build.

    python -m eaglespec.bench.gemm [--rows 1,2,4,8] [--blocks inductor,4,4p32,2,any] [--rounds 9]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

import torch

from ..errors import EagleError


class _Products(torch.nn.Module):
    def __init__(self, count: int, k: int, n: int):
        super().__init__()
        self.products = torch.nn.ModuleList(torch.nn.Linear(k, n, bias=False) for _ in range(count))

    def forward(self, x):
        return [p(x) for p in self.products]


ANY = "any"  # not a micro-GEMM block: max-autotune's pick among all backends


def _blocks(text: str) -> list:
    """'inductor,4,2p32,any' -> [None, GemmBlock(4), GemmBlock(2, 32), ANY]."""
    from ..engine.gemm_kernels import GemmBlock

    out = []
    for part in text.split(","):
        found = re.fullmatch(r"r?(\d+)(?:-?p(\d+)(?:-?m(\d+))?)?", part)
        if part in ("inductor", ANY):
            out.append(None if part == "inductor" else ANY)
        elif found and int(found[1]) > 0 and int(found[3] or 1) > 0:
            out.append(GemmBlock(int(found[1]), int(found[2] or 0), int(found[3] or 1)))
        else:
            raise EagleError(f"--blocks {text!r}: give 'inductor', 'any', a positive number of register rows, or "
                             "rows and a prefetch distance (2p32), and the fewest rows that prefetch (4p32m5), "
                             "comma-separated, e.g. inductor,4,2p32")
    return out


@torch.no_grad()
def gemm_times(rows: list[int], blocks: list, products: int = 120,
               shape: tuple[int, int] = (576, 1536), rounds: int = 9, say=print) -> tuple[dict, dict]:
    """-> ({(block, rows): median seconds of one pass over every product}, {rows: the blocks whose
    products are not bit for bit the first block's}); a block is a gemm_kernels.GemmBlock, None
    (inductor's own kernels) or ANY."""
    from ..engine.compiled import _inductor_options
    from ..engine.gemm_kernels import CPU_GEMM_BACKENDS, cpu_gemm_block, micro_gemms
    from .roofline import interleaved_medians

    torch.manual_seed(0)
    module = _Products(products, *shape).eval()
    runners, outputs = {}, {}
    inputs = {m: torch.randn(m, shape[0]) for m in rows}  # the same for every block
    with tempfile.TemporaryDirectory(prefix="eaglespec-gemm-") as folder:
        for block in blocks:
            for m in rows:
                x = inputs[m]
                began = time.perf_counter()
                program = torch.export.export(module, (x,), strict=False)
                path = Path(folder) / f"gemm-{block}-{m}.pt2"
                # no cache: each block's build is its own (its first run, before inductor's graph
                # cache keyed on the block, was served the first block's code for the second)
                backends, kernels = (None, cpu_gemm_block()) if block == ANY else (CPU_GEMM_BACKENDS, block)
                kernels = kernels and kernels.at_rows(m)  # as a step of m rows is built (None: inductor's)
                options = _inductor_options(True, gemm_backends=backends) | {"force_disable_caches": True}
                with torch._inductor.config.patch(options), micro_gemms("cpu", kernels):
                    torch._inductor.aoti_compile_and_package(program, package_path=str(path))
                runners[(block, m)] = (torch._inductor.aoti_load_package(str(path)), x)
                outputs[(block, m)] = runners[(block, m)][0](x)
                say(f"built {m} row(s), block {_name(block)} in {time.perf_counter() - began:.0f} s")
        times = interleaved_medians(list(runners), lambda case: runners[case][0](runners[case][1]), rounds)
    differ = {m: [block for block in blocks[1:]
                  if not all(torch.equal(a, b) for a, b in zip(outputs[(blocks[0], m)], outputs[(block, m)], strict=True))]
              for m in rows}
    return times, differ


def _name(block) -> str:
    return "inductor" if block is None else str(block)


def main(argv: list[str] | None = None) -> int:
    from ..engine.compiled import compiler_problem
    from ..engine.gemm_kernels import prefetch_line
    from ..pause import hold_machine
    from .roofline import machine_line

    p = argparse.ArgumentParser(prog="python -m eaglespec.bench.gemm", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="1,2,4,8", help="rows of each product (query tokens of a step)")
    p.add_argument("--blocks", "--register-rows", dest="blocks", default="inductor,4,4p32",
                   help="micro-GEMM blocks to compare: 'inductor' (its own kernels), the most rows a micro-kernel "
                   "holds (4), rows and how many k-rows of weights ahead it prefetches into L2 (2p32); 'any': "
                   "max-autotune's pick among all backends (oneDNN's included)")
    p.add_argument("--products", type=int, default=120)
    p.add_argument("--shape", default="576x1536", help="K x N of each product")
    p.add_argument("--rounds", type=int, default=9)
    args = p.parse_args(argv)
    try:
        rows = list(dict.fromkeys(int(r) for r in args.rows.split(",")))
        k, n = (int(v) for v in args.shape.split("x"))
        if min(rows + [k, n]) < 1:
            raise ValueError
    except ValueError:
        raise SystemExit(f"--rows {args.rows!r} / --shape {args.shape!r}: give positive numbers, "
                         "e.g. --rows 1,8 --shape 576x1536")
    if args.rounds < 1 or args.products < 1:
        raise SystemExit(f"--rounds {args.rounds} / --products {args.products}: give at least 1")
    try:
        blocks = list(dict.fromkeys(_blocks(args.blocks)))
    except EagleError as exc:
        raise SystemExit(str(exc))
    if any(getattr(b, "prefetch", 0) for b in blocks) and prefetch_line() is None:
        raise SystemExit(f"--blocks {args.blocks!r}: this torch's micro-GEMM template has no line a prefetch can "
                         "follow; give blocks without one, e.g. inductor,4,2")
    problem = compiler_problem()
    if problem is not None:
        raise SystemExit(f"inductor's C++ backend cannot build here: {problem}")
    size = args.products * k * n * 4
    print(f"{args.products} products of {k} x {n} fp32 ({size / 1e6:.0f} MB) on {machine_line('float32')}",
          file=sys.stderr)
    with hold_machine():  # a background capture or training run sleeps meanwhile
        times, differ = gemm_times(rows, blocks, args.products, (k, n), args.rounds,
                                 say=lambda line: print(line, file=sys.stderr))
    print(f"{'block':13s}" + "".join(f"  m={m:<3d} ms" for m in rows) + "  GB/s at m=1  cost(m)/cost(1)")
    for block in blocks:
        cells = "".join(f"  {times[(block, m)] * 1e3:8.1f}" for m in rows)
        one = times.get((block, 1))
        ratios = " ".join(f"{times[(block, m)] / one:.2f}" for m in rows) if one else ""
        print(f"{_name(block):13s}{cells}  {size / one / 1e9 if one else float('nan'):11.1f}  {ratios}")
    if len(blocks) > 1:
        print(f"products bit for bit the same as {_name(blocks[0])}'s: "
              + ", ".join(f"m={m} " + ("yes" if not differ[m] else "NO, " + " ".join(_name(b) for b in differ[m]))
                          for m in rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
