"""One-off: a generation's wall time split into the target's package calls, the draft's, and the rest (chain:3, 16k head)."""
import time, torch, collections, cProfile, pstats, sys
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.bench.datasets import load_questions
gen = EagleGenerator.from_pretrained(tree=sys.argv[1] if len(sys.argv) > 1 else "chain:3")
prompts = [gen.encode(messages=[{"role": "user", "content": q.turns[0]}]) for q in load_questions("mt-bench", 6)[2:]]
owner = gen.target.steps
orig = owner._runner
acc = collections.defaultdict(float); calls = collections.Counter()
def runner(key, args, module=None, what="the target's step"):
    fn = orig(key, args, module, what)
    def call(*a):
        t = time.perf_counter(); r = fn(*a); acc[what] += time.perf_counter() - t; calls[what] += 1; return r
    return call
owner._runner = runner
gen.generate("Hello", max_new_tokens=8)
for label in ("eagle", "vanilla"):
    acc.clear(); calls.clear(); total = 0.0; toks = 0; fwd = 0
    for ids in prompts:
        t = time.perf_counter()
        r = gen.generate(input_ids=ids, max_new_tokens=128, speculative=label != "vanilla")
        total += time.perf_counter() - t; toks += len(r.token_ids); fwd += len(r.steps) + 1
    pre = 0.0
    for ids in prompts:
        t = time.perf_counter(); gen.generate(input_ids=ids, max_new_tokens=1, speculative=label != "vanilla"); pre += time.perf_counter() - t
    print(label, f"prefill (1 token) {pre:.2f} s for {len(prompts)} prompts")
    print(label, f"total {total:.2f} s, tokens {toks}, target forwards {fwd}, ms/forward {total/max(fwd,1)*1e3:.2f}")
    for w in acc: print(f"  {w}: {acc[w]:.2f} s in {calls[w]} calls, {acc[w]/max(fwd,1)*1e3:.2f} ms per forward")
    print(f"  rest: {total - sum(acc.values()):.2f} s, {(total - sum(acc.values()))/max(fwd,1)*1e3:.2f} ms per forward")
pr = cProfile.Profile(); pr.enable()
for ids in prompts[:2]: gen.generate(input_ids=ids, max_new_tokens=128)
pr.disable()
pstats.Stats(pr).sort_stats("cumtime").print_stats(60)
