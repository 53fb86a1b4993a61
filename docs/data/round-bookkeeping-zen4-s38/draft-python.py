"""Python overhead of drafting with the draft's packages stubbed out: -> ms per _draft_trees call."""
import time, torch, functools, statistics, sys
torch.set_num_threads(2)
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.engine.batch import Batch
gen = EagleGenerator.from_pretrained(tree=sys.argv[1] if len(sys.argv) > 1 else "dynamic:2,3,3", draft_floor=0.15)
ids = gen.encode("Tell me about rivers and lakes in Europe, at length.")
gen.generate(input_ids=ids, max_new_tokens=24)
steps = gen.target.steps
real = steps._runner
def fake(key, args, module=None, what=""):
    rb, q = key[0], key[1]
    if what.startswith("the draft's LM"):
        t = torch.full((rb, q, 8192), -20.0); t[..., 5] = 0.0; t[..., 7] = -1.0
        return lambda *a: t
    if what.startswith("the draft head"):
        o = torch.zeros(rb, q, 576)
        return lambda *a: o
    return real(key, args, module, what)
steps._runner = fake
times = []
orig = Batch._draft_trees
def timed(self, drafter):
    t = time.perf_counter(); r = orig(self, drafter); times.append(time.perf_counter() - t); return r
Batch._draft_trees = timed
for rnd in range(3):
    times.clear()
    r = gen.generate(input_ids=ids, max_new_tokens=200)
    print(f"{len(times)} drafts, median {statistics.median(times)*1e3:.3f} ms, mean {statistics.mean(times)*1e3:.3f} ms, levels {statistics.mean([s.levels or 0 for s in r.steps]):.2f}")
