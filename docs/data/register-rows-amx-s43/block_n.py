"""bench.gemm's products with inductor's fp32 AVX-512 micro-GEMM table cut to one register block
(rows x columns), each block built and timed in one process:  python block_n.py 4x16,4x32,2x48"""
import dataclasses
import sys

import torch

import eaglespec.engine.compiled as c
from eaglespec.bench import gemm

configs, micro = c._micro_gemm_table()
saved = list(configs)
wanted = [tuple(int(v) for v in b.split("x")) for b in sys.argv[1].split(",")]
results = {}
for m_rows, n_cols in wanted:
    template = next(x for x in saved if x.vec_isa_cls is micro.VecAVX512 and x.input_dtype == torch.float32)
    blocking = type(template.register_blocking)
    one = dataclasses.replace(template, register_blocking=blocking(m_rows, n_cols, template.register_blocking.block_k))
    configs[:] = [one] + [x for x in saved if not (x.vec_isa_cls is micro.VecAVX512 and x.input_dtype == torch.float32)]
    # a block number the cache key cannot confuse with another build: the rows patch is off (None)
    times, _ = gemm.gemm_times([1, 4, 8], [None], rounds=9, say=lambda _: None)
    results[(m_rows, n_cols)] = times
    configs[:] = saved
for block, times in results.items():
    print(f"{block[0]}x{block[1]}: " + "  ".join(f"m={m} {times[(None, m)] * 1e3:.1f} ms" for m in (1, 4, 8)))
