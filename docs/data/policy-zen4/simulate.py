"""One-off: replay --tree auto's adaptive policy (tuning.AdaptiveTree, the real class) and variants on
the traces of trace.py, with this machine's cached cost curve: predicted speedup over vanilla per prompt."""
import json, math, statistics, sys, collections
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.engine.tuning import AdaptiveTree

import gzip
path = sys.argv[1] if len(sys.argv) > 1 else "docs/data/policy-zen4/traces.jsonl.gz"
traces = [json.loads(l) for l in (gzip.open(path, "rt") if path.endswith(".gz") else open(path))]
gen = EagleGenerator.from_pretrained(tree="auto")
tuned = gen.tuned
floor = round(tuned.floor, 3)
print("floor", floor, "vanilla ms", round(tuned.vanilla * 1e3, 2), "table", [(n, round(tau, 2), round((d + v) / tuned.vanilla, 3)) for n, tau, d, v, _ in tuned.table])
# the traces know chains only: a rung that is not one (the 7-node tree here, 1.78x a vanilla step) is
# dropped; at this cost curve it is never the best choice for any acceptance scale (checked below)
is_chain = lambda t: t is None or all(all(r == 0 for r in p) for p in t.paths)
_from_tuned = AdaptiveTree.from_tuned.__func__
def chains_only(cls, tuned, **kw):
    pol = _from_tuned(cls, tuned, **kw)
    keep = [i for i, row in enumerate(pol.ladder) if is_chain(row[0])]
    assert pol.level in keep
    pol.level = keep.index(pol.level); pol.history = [pol.level]
    pol.ladder = [pol.ladder[i] for i in keep]
    return pol
AdaptiveTree.from_tuned = classmethod(chains_only)
full = _from_tuned(AdaptiveTree, tuned)
for scale in (0.1, 0.3, 0.5, 0.8, 1.0, 1.3, 1.6, 2.0):
    speeds = [(1.0 + (tau - 1.0) * scale) / cost for _, tau, cost in full.ladder]
    assert is_chain(full.ladder[max(range(len(speeds)), key=lambda i: speeds[i])][0]), scale


class Prior(AdaptiveTree):
    """Variant: the observed tau is shrunk toward the predicted one by `prior` steps' worth of it."""
    prior = 16

    def observe(self, emitted, cost=None):
        self.steps += 1
        tree, tau_predicted, full = self.ladder[self.level]
        self.emitted += emitted if cost is None or tree is None else emitted * full / cost
        if tree is None:
            if self.steps >= self.probe_wait:
                self.probing = True
                self._move(1)
            return
        if self.steps % self.window:
            return
        k = self.prior
        observed = (self.emitted - self.steps + k * (tau_predicted - 1.0)) / (self.steps + k)
        scale = observed / max(tau_predicted - 1.0, 1e-9)
        speeds = [(1.0 + (tau - 1.0) * scale) / cost for _, tau, cost in self.ladder]
        best = max(range(len(speeds)), key=lambda i: (speeds[i], -i))
        if self.probing:
            self.probe_wait = min(2 * self.probe_wait, self.max_probe_every) if best == 0 else self.probe_every
            self.probing = False
        self._move(best)


def run(trace, make, use_floor=True):
    steps = {i + 1: (acc, conf) for i, (acc, conf) in enumerate(trace["steps"])}  # position -> (accepted, confidences)
    n_out = trace["tokens"]
    pol = make()
    p, t, nsteps = 1, 0.0, 0
    log_floor = math.log(floor) if use_floor and floor > 0 else -math.inf
    while p < n_out:
        tree = pol.tree
        acc, conf = steps.get(p, (0, []))
        if tree is None:
            emitted, verified = 1, 1
        else:
            n = tree.num_nodes - 1
            kept = sum(1 for c in conf[:n] if c >= log_floor)
            verified = 1 + kept
            emitted = min(min(acc, kept) + 1, n_out - p)
        c = pol.step_cost(verified)
        t += c if c is not None else pol.ladder[pol.level][2]
        pol.observe(emitted, c)
        p += emitted
        nsteps += 1
    return (n_out - 1) * tuned.vanilla / t, (n_out - 1) / nsteps


class Fixed(AdaptiveTree):
    def observe(self, emitted, cost=None):
        pass


def policies():
    ladder_top = len(AdaptiveTree.from_tuned(tuned).ladder) - 1
    # probe_every given everywhere: the rows before the change used 64, the default of the time
    yield "current (window 8, probe 64)", lambda: AdaptiveTree.from_tuned(tuned, probe_every=64), True
    yield "fixed chain, floor", lambda: Fixed.from_tuned(tuned), True
    yield "fixed chain, no floor", lambda: Fixed.from_tuned(tuned), False
    for pe in (8, 16, 32):
        yield f"probe {pe}", (lambda pe=pe: AdaptiveTree.from_tuned(tuned, probe_every=pe)), True
    yield "probe 16, max 256", (lambda: AdaptiveTree.from_tuned(tuned, probe_every=16, max_probe_every=256)), True
    yield "probe 16, window 4", (lambda: AdaptiveTree.from_tuned(tuned, probe_every=16, window=4)), True
    yield "window 16", lambda: AdaptiveTree.from_tuned(tuned, window=16, probe_every=64), True
    for k in (8, 16, 32):
        def mk(k=k):
            pol = Prior.from_tuned(tuned, probe_every=64); pol.prior = k; return pol
        yield f"prior {k}", mk, True
    for k, pe in ((8, 32), (16, 32)):
        def mk2(k=k, pe=pe):
            pol = Prior.from_tuned(tuned, probe_every=pe); pol.prior = k; return pol
        yield f"prior {k}, probe {pe}", mk2, True


# synthetic heads: useless and unsure (every draft below the floor), useless and sure (never below it), 256 tokens
traces.append({"name": "useless-unsure", "category": "synthetic-unsure", "tokens": 256, "steps": [[0, [-5.0, -6.0, -7.0]]] * 255})
traces.append({"name": "useless-sure", "category": "synthetic-sure", "tokens": 256, "steps": [[0, [-0.1, -0.2, -0.3]]] * 255})
groups = lambda tr: ["all-mt" if tr["category"].startswith("mt-") else "all-tasks" if tr["category"].startswith("task-") else "all-synthetic" if tr["category"].startswith("synthetic") else tr["category"], tr["category"]]
rows = {}
for name, make, use_floor in policies():
    per = collections.defaultdict(list)
    for tr in traces:
        sp, tau = run(tr, make, use_floor)
        for g in groups(tr):
            per[g].append((sp, tau, tr["tokens"]))
    rows[name] = per
cats = sorted({g for tr in traces for g in groups(tr)} - {"all-synthetic"}, key=lambda g: (not g.startswith("all"), g))
def agg(v):  # tokens-weighted: total vanilla time / total eagle time
    tv = sum(n for _, _, n in v); te = sum(n / sp for sp, _, n in v)
    return tv / te, min(sp for sp, _, _ in v)
print("policy".ljust(30), " ".join(c[:14].rjust(14) for c in cats))
for name, per in rows.items():
    print(name.ljust(30), " ".join(f"{agg(per[c])[0]:.3f}/{agg(per[c])[1]:.2f}".rjust(14) for c in cats))
print("(each cell: the set's speedup over vanilla by the cost curve, tokens-weighted / its worst prompt)")
