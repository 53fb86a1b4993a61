"""Head-like GEMMs (SmolLM2 head layer + fc + 4096-row draft LM head) compiled max-autotune+freezing, fp32 vs bf16, AMX kind.

    python docs/data/bf16-head-amx-s46/head_products.py 1,4   (rows of each product)
"""
import time, statistics, sys, torch
import torch._inductor.config as ic
from eaglespec.pause import hold_machine
ic.freezing = True
ic.max_autotune = True
ic.max_autotune_gemm_backends = "CPP,ATEN"
torch.manual_seed(0)
shapes = [(576,576),(576,192),(576,192),(576,576),(576,1536),(576,1536),(1536,576),(1152,576),(576,4096)]
class M(torch.nn.Module):
    def __init__(s):
        super().__init__(); s.l = torch.nn.ModuleList(torch.nn.Linear(k, n, bias=False) for k, n in shapes)
    def forward(s, x1, x15, x2):
        outs = []
        for (k, n), l in zip(shapes, s.l):
            outs.append(l(x1 if k == 576 else (x15 if k == 1536 else x2)).sum(-1))
        return torch.stack(outs)
flush = torch.ones(160_000_000)  # 640 MB: evicts the L3 as the target's step does
rows = [int(r) for r in sys.argv[1].split(",")]
with hold_machine():
    fns = {}
    for dt in (torch.float32, torch.bfloat16):
        m = M().eval().to(dt)
        for r in rows:
            xs = [torch.randn(r, k, dtype=dt) for k in (576, 1536, 1152)]
            t = time.time()
            with torch.no_grad():
                f = torch.compile(m, mode="max-autotune", dynamic=False)
                f(*xs); f(*xs)
            print(f"compiled {dt} m={r} in {time.time()-t:.0f}s", flush=True)
            fns[(dt, r)] = (f, xs)
    res = {k: {"hot": [], "cold": []} for k in fns}
    with torch.no_grad():
        for rep in range(15):
            for k, (f, xs) in fns.items():
                flush.add_(1.0)  # stream 640 MB
                t = time.perf_counter(); f(*xs); res[k]["cold"].append(time.perf_counter() - t)
                for _ in range(3):
                    t = time.perf_counter(); f(*xs); res[k]["hot"].append(time.perf_counter() - t)
    for k, v in res.items():
        print(k, "cold %.3f ms hot %.3f ms" % (1e3 * statistics.median(v["cold"]), 1e3 * statistics.median(v["hot"])))
