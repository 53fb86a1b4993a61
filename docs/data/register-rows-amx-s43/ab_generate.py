"""A/B in one process: EAGLE generation (`--tree auto`, the tree the 2-row cost curve chose) with the
target's and head's compiled packages of 4-row register blocks (an old artefact folder) and of 2-row
ones (the current folder), the same generator, packages swapped, prompts interleaved with the order
alternated; and vanilla decoding likewise.
    python ab_generate.py OLD_4ROW_FOLDER [questions]"""
import statistics
import sys
import time
from pathlib import Path

from eaglespec.bench.datasets import load_questions
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.pause import hold_machine

old_folder = Path(sys.argv[1])
n = int(sys.argv[2]) if len(sys.argv) > 2 else 10
gen = EagleGenerator.from_pretrained(tree="auto")
prompts = [gen.encode(messages=[{"role": "user", "content": q.turns[0]}]) for q in load_questions("mt-bench", n)]
steps = gen.target.steps
new_folder = steps.folder
runners = {}
for name, folder in (("rows2", new_folder), ("rows4", old_folder)):
    steps.folder = folder
    steps._runners.clear()
    gen.generate(input_ids=prompts[0], max_new_tokens=32)
    gen.generate(input_ids=prompts[0], max_new_tokens=32, speculative=False)
    runners[name] = dict(steps._runners)


def use(name):
    steps._runners.clear()
    steps._runners.update(runners[name])


times, outs = {}, {}
with hold_machine():
    for i, ids in enumerate(prompts):
        for spec in (True, False):
            order = ("rows4", "rows2") if i % 2 == 0 else ("rows2", "rows4")
            for name in order:
                use(name)
                t = time.perf_counter()
                r = gen.generate(input_ids=ids, max_new_tokens=128, speculative=spec)
                times.setdefault((name, spec), []).append(time.perf_counter() - t)
                outs[(name, spec, i)] = list(r.token_ids)
for spec in (True, False):
    ratios = [a / b for a, b in zip(times[("rows4", spec)], times[("rows2", spec)])]
    print(f"{'EAGLE' if spec else 'vanilla':8s} pairs {len(ratios)}  time 4-row / 2-row: median {statistics.median(ratios):.3f}, "
          f"total {sum(times[('rows4', spec)]) / sum(times[('rows2', spec)]):.3f}")
eagle = sum(times[("rows2", False)]) / sum(times[("rows2", True)])
eagle4 = sum(times[("rows4", False)]) / sum(times[("rows4", True)])
print(f"EAGLE over vanilla: {eagle:.3f}x with 2-row packages, {eagle4:.3f}x with 4-row ones (same tree)")
print("identical:", all(outs[("rows4", s, i)] == outs[("rows2", s, i)] == outs[("rows2", False, i)]
                        for s in (True, False) for i in range(len(prompts))))
