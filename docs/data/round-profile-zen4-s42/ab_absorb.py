"""The absorb padded to the smallest built head graph that holds its pairs (new) against always
the tree's depth + 1 (old), in one process: MT-bench questions 3-12, 128 new tokens, `--tree auto`
(the policy on), 3 passes, the order alternating; outputs must be equal. Prints old/new total time."""
import statistics, time
from eaglespec.pause import hold_machine
from eaglespec.draft import drafter as dr
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.bench.datasets import load_questions, user_message

init = dr.Drafter.__init__
mode = {"old": False}
def patched_init(self, *a, **k):
    init(self, *a, **k)
    self._new_widths = self._absorb_widths
orig_absorb = dr.Drafter._absorb
def absorb(self, *a, **k):
    self._absorb_widths = {True: [self.absorb_width], False: [self.absorb_width]} if mode["old"] else self._new_widths
    return orig_absorb(self, *a, **k)
dr.Drafter.__init__, dr.Drafter._absorb = patched_init, absorb

with hold_machine():
    g = EagleGenerator.from_pretrained(tree="auto")
    qs = load_questions("mt-bench", 12)[2:12]
    prompts = [g.encode(messages=[{"role": "user", "content": user_message(q, 0, "mt-bench", True)}]) for q in qs]
    for m in (True, False):
        mode["old"] = m; g.generate(input_ids=prompts[0], max_new_tokens=32)
    total = {"old": 0.0, "new": 0.0}; pairs = []; outs = {}
    for rnd in range(3):
        for i, ids in enumerate(prompts):
            t = {}
            for name in (("old", "new") if (rnd + i) % 2 == 0 else ("new", "old")):
                mode["old"] = name == "old"
                s = time.perf_counter(); r = g.generate(input_ids=ids, max_new_tokens=128); t[name] = time.perf_counter() - s
                outs.setdefault((i, name), r.token_ids); assert outs[(i, name)] == r.token_ids
                total[name] += t[name]
            assert outs[(i, "old")] == outs[(i, "new")]
            pairs.append(t["old"] / t["new"])
    print(f"old/new total {total['old'] / total['new']:.4f}, median pair {statistics.median(pairs):.4f}, new faster in {sum(p > 1 for p in pairs)} of {len(pairs)}; outputs equal")
