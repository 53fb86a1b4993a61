"""A/B in one process: the round's bookkeeping before (per-layer KV moves, torch's package wrapper) and after."""
import time, statistics, torch
from torch.export.pt2_archive._package import AOTICompiledModel
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.engine import compiled
from eaglespec.engine.kv_cache import in_place, move_paths
from eaglespec.bench.datasets import load_questions
gen = EagleGenerator.from_pretrained(tree="auto")
prompts = [gen.encode(messages=[{"role": "user", "content": q.turns[0]}]) for q in load_questions("mt-bench", 10)[2:]]
gen.generate(input_ids=prompts[0], max_new_tokens=32)
steps = gen.target.steps
new_keep = compiled.StaticRows.keep_paths
def old_keep(self, start, paths):
    counts = [p.numel() for p in paths]
    if not in_place(self.lens, start, paths):
        move_paths(self.buffers(), self.lens, start, paths)
    self.lens += torch.tensor(counts)
    self._length = int(self.lens.max())
fast = dict(steps._runners)
slow = {k: (AOTICompiledModel(v.loader) if isinstance(v, compiled._Package) else v) for k, v in fast.items()}
def use(which):
    compiled.StaticRows.keep_paths = new_keep if which == "new" else old_keep
    steps._runners.clear(); steps._runners.update(fast if which == "new" else slow)
times = {"old": [], "new": []}; outs = {}
for rnd in range(3):
    for i, ids in enumerate(prompts):
        order = ("old", "new") if (i + rnd) % 2 == 0 else ("new", "old")
        for which in order:
            use(which)
            t = time.perf_counter(); r = gen.generate(input_ids=ids, max_new_tokens=128); dt = time.perf_counter() - t
            times[which].append(dt); outs.setdefault((which, i), list(r.token_ids))
ratios = [o / n for o, n in zip(times["old"], times["new"])]
print("pairs", len(ratios), "median old/new", f"{statistics.median(ratios):.4f}", "total old/new", f"{sum(times['old'])/sum(times['new']):.4f}",
      "new faster in", sum(r > 1 for r in ratios))
print("identical", all(outs[("old", i)] == outs[("new", i)] for i in range(len(prompts))))
