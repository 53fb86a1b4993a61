"""bench.gemm with inductor's C++ vector ISA forced to 256 bits (AVX2 micro-kernels, cpp.simdlen) on an AVX-512 CPU:
    python avx2_gemm.py 256 4,2"""
import sys
import eaglespec.engine.compiled as c
from eaglespec.bench import gemm
orig = c._inductor_options
simd = int(sys.argv[1])
c._inductor_options = lambda *a, **k: orig(*a, **k) | {"cpp.simdlen": simd}
times, same = gemm.gemm_times([1, 4, 8], [int(b) if b.isdigit() else None for b in sys.argv[2].split(",")], rounds=9)
for (b, m), t in sorted(times.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
    print(f"simdlen {simd} block {b} m={m}: {t*1e3:.1f} ms")
print(same)
