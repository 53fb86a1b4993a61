"""One-off: the policy replayed at draft vocabularies 8,192 and 4,096 (traces of each, each with its own cost curve)."""
import gzip, json
from collections import defaultdict
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.engine.tuning import AdaptiveTree
from eaglespec.bench import policy as pol

def load(path):
    op = gzip.open if path.endswith(".gz") else open
    return [json.loads(l) for l in op(path, "rt")]

sets = {8192: load("docs/data/policy-zen4/traces.jsonl.gz"), 4096: load("runs/policy4k/traces-4096.jsonl"  # python -m eaglespec.bench.policy trace --dataset mt-bench (then tasks) --draft-vocab 4096 --out runs/policy4k/traces-4096.jsonl)}
def group(r):
    n = r["name"]
    if n.startswith("mt"): return "mt-bench"
    if n.startswith("task"): return "tasks"
    return None
def cat(r):
    c = r["category"]
    for pre in ("mt-bench-", "tasks-", "mt-", "task-"):
        if c.startswith(pre): return c[len(pre):]
    return c
for v, records in sets.items():
    gen = EagleGenerator.from_pretrained(tree="auto", draft_vocab_size=v)
    t = gen.tuned
    print(v, "vanilla ms", round(t.vanilla * 1e3, 2), "table", [(n, round(tau, 2), round((d + vv) / t.vanilla, 3)) for n, tau, d, vv, _ in t.table], "floor", round(t.floor, 3))
    for label, fixed in (("policy (probe 16)", False), ("fixed chain", True)):
        per = defaultdict(list)
        for r in records:
            g = group(r)
            if g is None: continue
            make = lambda: pol.chain_ladder(AdaptiveTree.from_tuned(t, window=10**6 if fixed else 8))
            sp, tau = pol.replay(r, make(), gen.floor_for(t.tree))
            per[g].append((sp, tau, r["tokens"])); per[g + ":" + cat(r)].append((sp, tau, r["tokens"]))
        out = {}
        for k, vals in sorted(per.items()):
            tok = sum(n for _, _, n in vals)
            out[k] = round(tok / sum(n / sp for sp, _, n in vals), 3)
        print(" ", label, out)
    del gen
