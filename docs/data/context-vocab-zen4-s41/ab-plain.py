"""In one process: --tree auto with the draft vocabulary at 8,192 (default) and at 4,096, the task set (40) and
MT-bench questions 41-80, 128 new tokens, the two generators alternating first per prompt; every output compared."""
import sys, time, statistics, collections
import torch
from eaglespec.pause import hold_machine
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.bench.datasets import load_questions
with hold_machine():
    gens = {"v8192": EagleGenerator.from_pretrained(tree="auto"), "v4096": EagleGenerator.from_pretrained(tree="auto", draft_vocab_size=4096)}
    for k, g in gens.items(): print(k, "tree", g.tree, flush=True)
    qs = [("tasks/" + q.category, q) for q in load_questions("tasks")] + [("mt-bench", q) for q in load_questions("mt-bench", 80)[40:]]
    enc = gens["v8192"].encode
    prompts = [(cat, enc(messages=[{"role": "user", "content": q.turns[0]}])) for cat, q in qs]
    for g in gens.values(): g.generate(input_ids=prompts[0][1], max_new_tokens=32)
    times = collections.defaultdict(lambda: collections.defaultdict(float)); same = 0; rows = []
    for i, (cat, ids) in enumerate(prompts):
        order = list(gens) if i % 2 == 0 else list(gens)[::-1]
        outs = {}
        for name in order:
            t = time.perf_counter(); r = gens[name].generate(input_ids=ids, max_new_tokens=128); dt = time.perf_counter() - t
            times[cat][name] += dt; times["all"][name] += dt; outs[name] = tuple(r.token_ids)
            times[cat + ":steps"][name] += len(r.steps); times[cat + ":toks"][name] += len(r.token_ids) - 1
        same += len(set(outs.values())) == 1
        times["all:steps"]["v8192"] += 0
    for cat in sorted(k for k in times if ":" not in k):
        t = times[cat]; s, k = times.get(cat + ":steps"), times.get(cat + ":toks")
        tau = "" if not s or not s["v8192"] else f"  tau {k['v8192']/s['v8192']:.2f} / {k['v4096']/s['v4096']:.2f}"
        print(f"{cat:28s} v8192 {t['v8192']:7.2f}s v4096 {t['v4096']:7.2f}s  8192/4096 time ratio {t['v8192']/t['v4096']:.3f}{tau}")
    print("identical outputs:", same, "of", len(prompts))
