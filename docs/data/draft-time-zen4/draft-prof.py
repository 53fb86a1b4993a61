"""One-off: where a chain-3 draft's time goes on the compiled path (16k head, 8,192 draft vocab)."""
import time, statistics, torch, cProfile, pstats, sys
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.draft.drafter import Drafter
from eaglespec.core.tree import StaticTree

gen = EagleGenerator.from_pretrained(tree="chain:3")
gen.generate("Hello", max_new_tokens=8)  # warm
target, tree = gen.target, gen.tree
print("tree", type(tree).__name__, getattr(tree, "num_nodes", None))
context = 256
g = torch.Generator().manual_seed(0)
prompt = torch.randint(0, target.vocab_size, (1, context), generator=g)
cache = target.new_cache()
layers = gen.head.hidden_layers
features = target.forward_states(prompt, cache, layers=layers).hidden[0]
drafter = Drafter(gen.head, target, tree, gen.draft_vocab)
state = drafter.new_state(1)
drafter.draft_rows(state, [prompt[0, 1:-1]], [features[:-2]], [int(prompt[0, -2])])
def draft():
    drafter.draft_rows(state, [prompt[0, -1:]], [features[-2:-1]], [int(prompt[0, -1])])
    state.rows.crop(context - 2)
for _ in range(20): draft()
ts = []
for _ in range(200):
    t = time.perf_counter(); draft(); ts.append(time.perf_counter() - t)
print("draft median ms", statistics.median(ts) * 1e3)
# pieces: the compiled head step and the LM head graph alone
steps = drafter.steps
orig_fwd, orig_lp = steps.forward, steps.logprobs
acc = {"head": [], "lp": []}
def fwd(*a, **k):
    t = time.perf_counter(); r = orig_fwd(*a, **k); acc["head"].append(time.perf_counter() - t); return r
def lp(*a, **k):
    t = time.perf_counter(); r = orig_lp(*a, **k); acc["lp"].append(time.perf_counter() - t); return r
steps.forward, steps.logprobs = fwd, lp
ts = []
for _ in range(200):
    acc["head"].clear(); acc["lp"].clear()
    t = time.perf_counter(); draft(); tot = time.perf_counter() - t
    ts.append((tot, sum(acc["head"]), sum(acc["lp"]), len(acc["head"]), len(acc["lp"])))
print("total/head/lp ms (median):", [round(statistics.median(x[i] for x in ts) * 1e3, 3) for i in range(3)], ts[0][3:])
# inside the head step: the runner call vs the glue
runner_t = []
orig_runner = steps.owner._runner
def runner(key, args, module, what):
    fn = orig_runner(key, args, module, what)
    def call(*a):
        t = time.perf_counter(); r = fn(*a); runner_t.append((what, time.perf_counter() - t)); return r
    return call
steps.owner._runner = runner
per = []
for _ in range(200):
    runner_t.clear(); draft(); per.append(list(runner_t))
import collections
by = collections.defaultdict(list)
for p in per:
    for i, (w, t) in enumerate(p): by[(i, w)].append(t)
for k, v in sorted(by.items()): print(k, round(statistics.median(v) * 1e3, 3))
steps.forward, steps.logprobs, steps.owner._runner = orig_fwd, orig_lp, orig_runner
pr = cProfile.Profile(); pr.enable()
for _ in range(200): draft()
pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(25)
