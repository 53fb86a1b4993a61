"""The cost curve's drafting, part by part (tuning.measure_step_costs as `--tree auto` tunes,
batch 1, context 256), timed like draft_parts.py: where do its 5.6 ms for the 3-node tree go,
against 3.4-3.7 ms a round inside a generation?"""
import statistics, time
from collections import defaultdict
from eaglespec.pause import hold_machine
from eaglespec.engine import compiled, tuning
from eaglespec.draft import drafter as dr
from eaglespec.engine.decoding import EagleGenerator

times = defaultdict(list)
def timed(owner, name, label=None):
    orig = getattr(owner, name)
    def f(*a, **k):
        t = time.perf_counter(); out = orig(*a, **k); times[label or name].append(time.perf_counter() - t); return out
    setattr(owner, name, f)
orig_runner = compiled.CompiledSteps._runner
def runner(self, key, *a, **k):
    r = orig_runner(self, key, *a, **k)
    def call(*args):
        t = time.perf_counter(); out = r(*args); times[("package",) + tuple(str(x)[:12] for x in key)].append(time.perf_counter() - t); return out
    return call
compiled.CompiledSteps._runner = runner
for owner, name in ((compiled.CompiledHeadSteps, "forward"), (compiled.CompiledHeadSteps, "logprobs"),
                    (dr.Drafter, "_draft_logprobs"), (dr.Drafter, "_absorb"), (dr.Drafter, "_grow_dynamic"),
                    (dr.Drafter, "_expand"), (dr.Drafter, "draft_rows")):
    timed(owner, name, f"{owner.__name__}.{name}")

with hold_machine():
    g = EagleGenerator.from_pretrained(tree="auto")
    trees = dict(g.tuned.trees)
    for rep in range(2):
        times.clear()
        step, costs, noise = tuning.measure_step_costs(g, trees, context=tuning.COST_CONTEXT, reps=5)
        print(f"vanilla {1000 * step:.2f} ms, noise {noise:.3f}; " + ", ".join(f"{n}: draft {1000 * d:.2f} verify {1000 * v:.2f} ms" for n, (d, v) in costs.items()))
        for k, v in sorted(times.items(), key=lambda kv: -sum(kv[1])):
            print(f"  {str(k):70s} {len(v):5d} calls, median {1000 * statistics.median(v):.3f} ms")
