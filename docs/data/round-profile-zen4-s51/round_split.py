"""Where an EAGLE generation's time goes against vanilla's, in one process, the machine held: MT-bench
first turns 3-N (N = argv[1], default 12), 256 new tokens, `--tree auto` with the adaptive policy on (what
`eaglespec bench` runs), EAGLE and vanilla interleaved per question (order alternating). Each part's total
seconds: the whole generate, Batch.add (the eager prefill and the head's absorb of the prompt), Batch.step
(a round), its drafting (Batch._draft_trees) and the target's compiled step (CompiledSteps.verify_rows).

    python docs/data/round-profile-zen4-s51/round_split.py [N]
"""
import statistics, sys, time
from collections import defaultdict
from eaglespec.pause import hold_machine
from eaglespec.engine import compiled, batch as batch_mod
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.bench.datasets import load_questions, user_message

T = defaultdict(float); N = defaultdict(int)
mode = ["?"]
def wrap(cls, name, key):
    orig = getattr(cls, name)
    def f(self, *a, **k):
        t = time.perf_counter(); out = orig(self, *a, **k)
        T[(mode[0], key)] += time.perf_counter() - t; N[(mode[0], key)] += 1
        return out
    setattr(cls, name, f)
wrap(compiled.CompiledSteps, "verify_rows", "verify")
wrap(batch_mod.Batch, "_draft_trees", "draft")
wrap(batch_mod.Batch, "step", "step")
wrap(batch_mod.Batch, "add", "add(prefill)")
n = int(sys.argv[1]) if len(sys.argv) > 1 else 12
with hold_machine():
    g = EagleGenerator.from_pretrained(tree="auto")
    qs = load_questions("mt-bench", n)[2:n]
    prompts = [g.encode(messages=[{"role": "user", "content": user_message(q, 0, "mt-bench", True)}]) for q in qs]
    g.generate(input_ids=prompts[0], max_new_tokens=32); g.generate(input_ids=prompts[0], max_new_tokens=32, speculative=False)
    T.clear(); N.clear()
    toks = defaultdict(int)
    for i, ids in enumerate(prompts):
        for spec in ((True, False) if i % 2 == 0 else (False, True)):
            mode[0] = "eagle" if spec else "vanilla"
            t = time.perf_counter()
            r = g.generate(input_ids=ids, max_new_tokens=256, speculative=spec)
            T[(mode[0], "generate")] += time.perf_counter() - t; N[(mode[0], "generate")] += 1
            toks[mode[0]] += len(r.token_ids)
    for m in ("vanilla", "eagle"):
        steps = N[(m, "step")]
        print(f"{m}: tokens {toks[m]}, steps {steps}, tau {toks[m] / steps:.3f}")
        for k in ("generate", "add(prefill)", "step", "draft", "verify"):
            print(f"   {k:14s} total {T[(m, k)]:.2f} s  calls {N[(m, k)]}  per step {1000 * T[(m, k)] / steps:.2f} ms")
        rest = T[(m, "step")] - T[(m, "draft")] - T[(m, "verify")]
        print(f"   step rest per step {1000 * rest / steps:.2f} ms; outside steps {T[(m,'generate')] - T[(m,'step')]:.2f} s")
    print("speedup", T[("vanilla", "generate")] / T[("eagle", "generate")])
