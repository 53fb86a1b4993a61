"""One-off: the draft's matrices compiled (max-autotune, frozen) in fp32 against int8 weight-only."""
import time, statistics, torch, sys
from eaglespec.engine.quant import Int8WeightOnlyLinear
torch.set_num_threads(2)
torch._inductor.config.freezing = True
class LM(torch.nn.Module):
    def __init__(s, lin): super().__init__(); s.lin = lin
    def forward(s, x): return torch.log_softmax(s.lin(x), -1)
class MLP(torch.nn.Module):
    def __init__(s, g, u, d): super().__init__(); s.g, s.u, s.d = g, u, d
    def forward(s, x): return s.d(torch.nn.functional.silu(s.g(x)) * s.u(x))
torch.manual_seed(0)
lm = torch.nn.Linear(576, 8192, bias=False)
g, u, d = torch.nn.Linear(576, 1536, bias=False), torch.nn.Linear(576, 1536, bias=False), torch.nn.Linear(1536, 576, bias=False)
mods = {"lm-fp32": LM(lm), "lm-int8": LM(Int8WeightOnlyLinear(lm)),
        "mlp-fp32": MLP(g, u, d), "mlp-int8": MLP(*(Int8WeightOnlyLinear(x) for x in (g, u, d)))}
res = {}
for name, m in mods.items():
    m.eval()
    for M in (1, 4):
        x = torch.randn(M, 576)
        ref = m(x)
        t0 = time.time()
        with torch.no_grad():
            c = torch.compile(m, mode="max-autotune")
            y = c(x)
        ct = time.time() - t0
        err = (y - ref).abs().max().item()
        eager = []
        comp = []
        with torch.no_grad():
            for _ in range(30): c(x); m(x)
            for _ in range(300):
                t = time.perf_counter(); c(x); comp.append(time.perf_counter() - t)
                t = time.perf_counter(); m(x); eager.append(time.perf_counter() - t)
        print(f"{name} M={M}: compiled {statistics.median(comp)*1e3:.3f} ms, eager {statistics.median(eager)*1e3:.3f} ms, compile {ct:.0f} s, maxerr vs eager {err:.2e}", flush=True)
        torch._dynamo.reset()
