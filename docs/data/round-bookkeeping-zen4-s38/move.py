import time, torch
torch.set_num_threads(2)
from eaglespec.engine.kv_cache import move_paths
L=30
kv = torch.randn(2*L, 1, 3, 1024, 64)
sep = [torch.randn(1, 3, 1024, 64) for _ in range(2*L)]
lens = torch.tensor([300]); paths=[torch.tensor([0, 2, 3])]
def big():
    n, width = 1, 3
    src = torch.tensor([[300+0, 300+2, 300+3]]); dst = lens[:, None] + torch.arange(width)[None]
    rows = kv.narrow(-4, 0, n); shape = (2*L, n, 3, width, 64); view=(1, n, 1, width, 1)
    moved = rows.gather(-2, src.view(view).expand(shape)); rows.scatter_(-2, dst.view(view).expand(shape), moved)
for r in range(3):
    t=time.perf_counter()
    for _ in range(300): move_paths(sep, lens, 300, paths)
    a=(time.perf_counter()-t)/300*1e3
    t=time.perf_counter()
    for _ in range(300): big()
    b=(time.perf_counter()-t)/300*1e3
    print(f"60 tensors {a:.3f} ms, one tensor {b:.3f} ms")
