"""One-off: the draft LM head at one row as a fused reduction over int8 / bf16 weights (inductor C++), vs the fp32 GEMM template."""
import time, statistics, torch
torch.set_num_threads(2)
torch._inductor.config.freezing = True
torch.manual_seed(0)
W = torch.randn(8192, 576) * 0.05
class GemmLM(torch.nn.Module):
    def __init__(s): super().__init__(); s.w = torch.nn.Parameter(W.clone(), requires_grad=False)
    def forward(s, x): return torch.log_softmax(x @ s.w.T, -1)
class RedLM(torch.nn.Module):
    def __init__(s, kind):
        super().__init__()
        if kind == "int8":
            sc = W.abs().amax(1) / 127
            s.register_buffer("w", (W / sc[:, None]).round().to(torch.int8)); s.register_buffer("sc", sc)
        else:
            s.register_buffer("w", W.to(torch.bfloat16)); s.register_buffer("sc", torch.ones(8192))
    def forward(s, x):  # x [M, 576]
        y = (x[:, None, :] * s.w[None].float()).sum(-1) * s.sc
        return torch.log_softmax(y, -1)
ref = None
for name, m in {"fp32-gemm": GemmLM(), "int8-red": RedLM("int8"), "bf16-red": RedLM("bf16")}.items():
    m.eval()
    for M in (1, 2, 4):
        x = torch.randn(M, 576)
        with torch.no_grad():
            c = torch.compile(m, mode="max-autotune"); y = c(x)
            r = GemmLM()(x)
            ts = []
            for _ in range(30): c(x)
            for _ in range(500):
                t = time.perf_counter(); c(x); ts.append(time.perf_counter() - t)
        agree = (y.argmax(-1) == r.argmax(-1)).float().mean().item()
        print(f"{name} M={M}: {statistics.median(ts)*1e3:.3f} ms; max |dlogp| {(y-r).abs().max():.3f}, argmax agree {agree}", flush=True)
        torch._dynamo.reset()
