"""One-off: the adaptive tree's first probe after 16 vanilla steps (the new default) against 64 (the old),
the fixed tuned tree and vanilla, side by side per prompt: make run's prompt and the task set, 256 tokens."""
import sys
from eaglespec.engine import decoding, tuning
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.bench.datasets import load_questions, Question
from eaglespec.bench.harness import run_bench
from eaglespec.bench.methods import LoopMethod, TunedVariant
from eaglespec.bench.metrics import summarize


class Probe64(tuning.AdaptiveTree):
    def __init__(self, *a, **kw):
        kw.setdefault("probe_every", 64)
        super().__init__(*a, **kw)


class OldPolicy(LoopMethod):
    def run(self, input_ids, max_new_tokens, sampling):
        decoding.AdaptiveTree = Probe64
        try:
            return super().run(input_ids, max_new_tokens, sampling)
        finally:
            decoding.AdaptiveTree = tuning.AdaptiveTree


gen = EagleGenerator.from_pretrained(tree="auto")
assert tuning.PROBE_EVERY == 16
qs = [Question(f"make-run-{i}", "make-run", ("Explain in a few sentences why the sky is blue.",)) for i in range(int(sys.argv[1]))] + load_questions("tasks")
methods = [LoopMethod(gen, "vanilla", None), LoopMethod(gen, "auto", gen.tree), OldPolicy(gen, "auto-probe64", gen.tree),
           TunedVariant(gen, "auto-fixed")]
res = run_bench(qs, methods, lambda m: gen.encode(messages=m), gen.decode, max_new_tokens=256)
print("lossless:", res.lossless, res.failures[:3])
s = summarize([(e.method, e.category, e.record) for e in res.entries], "vanilla", {m.name: 3 for m in methods})
for k, v in s.items():
    print(k, {x: (round(v[x], 4) if isinstance(v.get(x), float) else v.get(x)) for x in ("tokens", "seconds", "tokens_per_s", "speedup", "tau")})
    print("   by category", {c: round(x, 3) for c, x in (v.get("speedup_by_category") or {}).items()})
