"""The target's compiled step inside a generation: its seconds per call by query bucket, vanilla
(q=1) and `--tree auto` (adaptive off: the tuned tree each round), MT-bench questions 3-8, 128 new
tokens, the two interleaved per question, the machine held. Also the whole round and drafting."""
import statistics, sys, time
from collections import defaultdict
from eaglespec.pause import hold_machine
from eaglespec.engine import compiled, batch as batch_mod
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.bench.datasets import load_questions, user_message

times = defaultdict(list)
orig_verify = compiled.CompiledSteps.verify_rows
def verify(self, input_ids, *a, **k):
    t = time.perf_counter(); out = orig_verify(self, input_ids, *a, **k)
    times[("verify", compiled.bucket(input_ids.shape[1], compiled.QUERY_BUCKETS))].append(time.perf_counter() - t)
    return out
compiled.CompiledSteps.verify_rows = verify
orig_draft = batch_mod.Batch._draft_trees
def draft(self, drafter):
    t = time.perf_counter(); out = orig_draft(self, drafter); times[("draft", drafter is not None)].append(time.perf_counter() - t)
    return out
batch_mod.Batch._draft_trees = draft
orig_step = batch_mod.Batch.step
def step(self, *a, **k):
    t = time.perf_counter(); out = orig_step(self, *a, **k); times[("round", self.drafter is not None and any(s.speculative for s in self.sequences))].append(time.perf_counter() - t)
    return out
batch_mod.Batch.step = step

with hold_machine():
    g = EagleGenerator.from_pretrained(tree="auto")
    g.adaptive = False
    qs = load_questions("mt-bench", 8)[2:8]
    prompts = [g.encode(messages=[{"role": "user", "content": user_message(q, 0, "mt-bench", True)}]) for q in qs]
    g.generate(input_ids=prompts[0], max_new_tokens=32); g.generate(input_ids=prompts[0], max_new_tokens=32, speculative=False)
    times.clear()
    for ids in prompts:
        for spec in (True, False) if len(times) % 2 == 0 else (False, True):
            g.generate(input_ids=ids, max_new_tokens=128, speculative=spec)
    for k, v in sorted(times.items(), key=str):
        print(k, len(v), "median %.2f ms, mean %.2f ms" % (1000 * statistics.median(v), 1000 * statistics.mean(v)))
