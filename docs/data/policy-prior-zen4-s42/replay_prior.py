"""Session 42: the adaptive policy with a prior, replayed over chain traces of today's default
(4,096 + context tokens, the 16k head), nothing committed to the policy. The prior counts `prior`
steps at the calibrated tau into the tuned tree's judgements until the policy first moves (a
prior at every rung oscillated: after each move its fresh window is mostly prior, and it climbs
back). Traces: `python -m eaglespec.bench.policy trace --dataset {mt-bench,tasks,make-run.jsonl}
--out trace-*.jsonl`; trace-useless.jsonl.gz is synthetic (a head that never accepts, sure or
unsure of its drafts). Run from the repository: python docs/data/policy-prior-zen4-s42/replay_prior.py"""
import sys
from pathlib import Path
from eaglespec.bench import policy as bp
from eaglespec.cli.options import add_model_args, load_generator
from eaglespec.engine.tuning import AdaptiveTree
import argparse

class Primed(AdaptiveTree):
    prior = 0.0
    def observe(self, emitted, cost=None):  # AdaptiveTree.observe's judgement, with the prior while unmoved
        tree, tau_p, full = self.ladder[self.level]
        if tree is None or len(self.history) > 1 or not self.prior:
            return super().observe(emitted, cost)
        self.steps += 1
        self.emitted += emitted if cost is None else emitted * full / cost
        if self.steps % self.window:
            return
        scale = ((self.emitted + self.prior * tau_p) / (self.steps + self.prior) - 1.0) / max(tau_p - 1.0, 1e-9)
        speeds = [(1.0 + (tau - 1.0) * scale) / c for _, tau, c in self.ladder]
        self._move(max(range(len(speeds)), key=lambda i: (speeds[i], -i)))

def make(gen, prior):
    def f():
        p = bp.chain_ladder(AdaptiveTree.from_tuned(gen.tuned, probe_every=16, window=8))
        q = Primed(p.ladder, p.vanilla, p.start, p.window, p.probe_every, p.max_probe_every, p.level_cost)
        q.prior = prior
        return q
    return f

here = Path(__file__).parent
a = argparse.ArgumentParser(); add_model_args(a); gen = load_generator(a.parse_args([]))
floor = gen.floor_for(gen.tuned.tree)
for name in ("mt-bench", "tasks", "make-run", "useless"):
    records = bp._load(here / f"trace-{name}.jsonl.gz")
    variants = {f"prior {p}": (make(gen, p), floor) for p in (0, 4, 8, 16)}
    variants["fixed (no policy)"] = (lambda: bp.chain_ladder(AdaptiveTree.from_tuned(gen.tuned, probe_every=16, window=10**6)), floor)
    print(f"\n{name}:"); print("\n".join(bp.table(records, variants)))
