# make run's prompt: vanilla, --tree auto (the tuned, adaptive tree) and fixed 3-node shapes, alternating in one
# process, whole generations timed (prefill included, as make run's figure), greedy, every output checked equal.
# usage: python docs/data/headcheck-zen4-s54/ab_shapes.py ROUNDS (from the repository root; compiled, as make run)
import json, statistics, sys, tempfile, time
from pathlib import Path
from eaglespec.engine.decoding import EagleGenerator
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
prompt = sys.argv[2] if len(sys.argv) > 2 else "Explain in a few sentences why the sky is blue."
gen = EagleGenerator.from_pretrained(None, "default", "auto")
ids = list(gen.encode(prompt))
folder = Path(tempfile.mkdtemp())
def tree_file(paths):
    path = folder / f"{len(list(folder.iterdir()))}.json"
    path.write_text(json.dumps(paths))
    return str(path)
methods = {"vanilla": dict(speculative=False), "auto": {}, "star [[0],[1],[2]]": dict(tree=tree_file([[0], [1], [2]])),
           "two levels [[0],[1],[0,0]]": dict(tree=tree_file([[0], [1], [0, 0]])), "chain:3": dict(tree="chain:3")}
times = {m: [] for m in methods}; taus = {}
ref = gen.generate(input_ids=ids, max_new_tokens=256, speculative=False).token_ids
for m, kw in methods.items():  # warm each (compiled graphs, drafters)
    gen.generate(input_ids=ids, max_new_tokens=256, **kw)
for r in range(rounds):
    order = list(methods)[r % len(methods):] + list(methods)[:r % len(methods)]
    for m in order:
        t = time.perf_counter(); out = gen.generate(input_ids=ids, max_new_tokens=256, **methods[m])
        times[m].append(time.perf_counter() - t); taus[m] = out.tau
        assert out.token_ids == ref, m
v = statistics.median(times["vanilla"])
print(f"{len(ref)} new tokens, {rounds} rounds, medians; every output equal to vanilla")
for m in methods:
    print(f"{m:28} {statistics.median(times[m])*1e3:7.1f} ms  tau {taus[m]:.2f}  speedup {v/statistics.median(times[m]):.3f}x"
          f"  (rounds {min(v/t for t in times[m]):.2f}-{max(v/t for t in times[m]):.2f}x)")
