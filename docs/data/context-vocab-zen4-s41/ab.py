"""In one process: --tree auto with the draft vocabulary at 8,192 (default) and at 4,096, the task set (40) and
MT-bench questions 41-80, 128 new tokens, the two generators alternating first per prompt; every output compared."""
import sys, time, statistics, collections
import torch
from eaglespec.pause import hold_machine
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.bench.datasets import load_questions
with hold_machine():
    gens = {"v8192": EagleGenerator.from_pretrained(tree="auto", context_vocab=False),
            "v4096c": EagleGenerator.from_pretrained(tree="auto", draft_vocab_size=4096),
            "v8192c": EagleGenerator.from_pretrained(tree="auto")}
    for k, g in gens.items(): print(k, "tree", g.tree, flush=True)
    qs = [("tasks/" + q.category, q) for q in load_questions("tasks")] + [("mt-bench", q) for q in load_questions("mt-bench", 80)[40:]]
    enc = gens["v8192"].encode
    prompts = [(cat, enc(messages=[{"role": "user", "content": q.turns[0]}])) for cat, q in qs]
    for g in gens.values(): g.generate(input_ids=prompts[0][1], max_new_tokens=32)
    times = collections.defaultdict(lambda: collections.defaultdict(float)); same = 0; rows = []
    for i, (cat, ids) in enumerate(prompts):
        names = list(gens); order = names[i % 3:] + names[:i % 3]
        outs = {}
        for name in order:
            t = time.perf_counter(); r = gens[name].generate(input_ids=ids, max_new_tokens=128); dt = time.perf_counter() - t
            times[cat][name] += dt; times["all"][name] += dt; outs[name] = tuple(r.token_ids)
            times[cat + ":steps"][name] += len(r.steps); times[cat + ":toks"][name] += len(r.token_ids) - 1
        same += len(set(outs.values())) == 1
    for cat in sorted(k for k in times if ":" not in k):
        t = times[cat]; s, k = times.get(cat + ":steps"), times.get(cat + ":toks")
        line = f"{cat:26s}" + "".join(f" {n} {t[n]:7.2f}s" for n in gens) + "  time ratios v8192/x: " + " ".join(f"{t['v8192']/t[n]:.3f}" for n in list(gens)[1:])
        if s and s["v8192"]: line += "  tau " + " / ".join(f"{k[n]/s[n]:.2f}" for n in gens)
        print(line)
    print("identical outputs:", same, "of", len(prompts))
