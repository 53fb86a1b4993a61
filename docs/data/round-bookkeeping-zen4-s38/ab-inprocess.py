"""In one process: generators from the old package copy (eaglespec_old) and the new code, twice new (an A/A check), rotating order.

The old copy: git worktree add /tmp/old 982ed40; mkdir /tmp/oldpkg; cp -r /tmp/old/src/eaglespec /tmp/oldpkg/eaglespec_old;
then in /tmp/oldpkg: grep -rl "eaglespec\." eaglespec_old | xargs sed -i 's/\beaglespec\./eaglespec_old./g'
"""
import sys, time, statistics, itertools
sys.path.insert(0, "/tmp/oldpkg")
import torch
from eaglespec.engine.decoding import EagleGenerator as New
from eaglespec_old.engine.decoding import EagleGenerator as Old
from eaglespec.bench.datasets import load_questions
gens = {"old": Old.from_pretrained(tree="auto"), "new": New.from_pretrained(tree="auto"), "new2": New.from_pretrained(tree="auto")}
prompts = [gens["new"].encode(messages=[{"role": "user", "content": q.turns[0]}]) for q in load_questions("mt-bench", 12)[2:]]
for g in gens.values(): g.generate(input_ids=prompts[0], max_new_tokens=32)
times = {k: [] for k in gens}; outs = {}
orders = list(itertools.permutations(gens))
for rnd in range(2):
    for i, ids in enumerate(prompts):
        for name in orders[(i + rnd * 5) % len(orders)]:
            t = time.perf_counter(); r = gens[name].generate(input_ids=ids, max_new_tokens=128); times[name].append(time.perf_counter() - t)
            outs.setdefault(i, set()).add(tuple(r.token_ids))
def cmp(a, b):
    rs = [x / y for x, y in zip(times[a], times[b])]
    return f"{a}/{b}: median {statistics.median(rs):.4f}, total {sum(times[a])/sum(times[b]):.4f}, {b} faster in {sum(r > 1 for r in rs)}/{len(rs)}"
print(cmp("old", "new")); print(cmp("old", "new2")); print(cmp("new2", "new"))
print("identical", all(len(v) == 1 for v in outs.values()))
