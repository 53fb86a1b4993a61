import time, statistics
from eaglespec.pause import hold_machine
from eaglespec.engine.decoding import EagleGenerator
P = "Explain in a few sentences why the sky is blue."
with hold_machine():
    gens = {}
    for name, kw in (("8192", dict(draft_vocab_size=8192, context_vocab=False)), ("4096c", {}), ("8192c", dict(draft_vocab_size=8192))):
        g = EagleGenerator.from_pretrained(tree="auto", **kw); g.adaptive = False; gens[name] = g
    ids = gens["8192"].encode(P)
    for g in gens.values(): g.generate(input_ids=ids, max_new_tokens=16)
    ts = {k: [] for k in gens}; ts["vanilla"] = []
    for rnd in range(4):
        for name, g in gens.items():
            t = time.perf_counter(); r = g.generate(input_ids=ids, max_new_tokens=84); ts[name].append(time.perf_counter() - t)
            if rnd == 0: print(name, "tau %.2f" % ((len(r.token_ids) - 1) / len(r.steps)), flush=True)
        t = time.perf_counter(); gens["8192"].generate(input_ids=ids, max_new_tokens=84, speculative=False); ts["vanilla"].append(time.perf_counter() - t)
    v = statistics.median(ts["vanilla"])
    for k in gens: print(k, "median %.3f s, over vanilla %.2fx" % (statistics.median(ts[k]), v / statistics.median(ts[k])))
