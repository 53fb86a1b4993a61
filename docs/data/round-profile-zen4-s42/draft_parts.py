"""A `--tree auto` round's drafting, part by part: wall time per call of each package (by its
key: rows, tokens, cache slots, tag) and of the Python around it, in a generation (MT-bench
questions 3-8, 128 new tokens, adaptive off), the machine held."""
import statistics, time
from collections import defaultdict
from eaglespec.pause import hold_machine
from eaglespec.engine import compiled
from eaglespec.draft import drafter as dr
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.bench.datasets import load_questions, user_message

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
    g.adaptive = False
    qs = load_questions("mt-bench", 8)[2:8]
    prompts = [g.encode(messages=[{"role": "user", "content": user_message(q, 0, "mt-bench", True)}]) for q in qs]
    g.generate(input_ids=prompts[0], max_new_tokens=32)
    times.clear()
    rounds = 0
    for ids in prompts:
        rounds += len(g.generate(input_ids=ids, max_new_tokens=128).steps) - 1
    print(rounds, "rounds;", g.tuned.tree.num_nodes, "nodes")
    for k, v in sorted(times.items(), key=lambda kv: -sum(kv[1])):
        print(f"{str(k):70s} {len(v):5d} calls, {len(v) / rounds:.2f} a round, median {1000 * statistics.median(v):.3f} ms, {1000 * sum(v) / rounds:.3f} ms a round")
