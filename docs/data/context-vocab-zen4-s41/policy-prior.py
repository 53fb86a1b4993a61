"""make run's prompt: the adaptive policy as is, with its evidence shrunk toward the prediction (a prior of W steps
at the predicted tau), and fixed (no adaptation); 4 rounds interleaved with vanilla, one process."""
import time, statistics, sys
from eaglespec.pause import hold_machine
from eaglespec.engine import tuning
from eaglespec.engine.decoding import EagleGenerator
P = sys.argv[1] if len(sys.argv) > 1 else "Explain in a few sentences why the sky is blue."
N = int(sys.argv[2]) if len(sys.argv) > 2 else 84
orig = tuning.AdaptiveTree.observe
def with_prior(w):
    def observe(self, emitted, cost=None):
        tree, tau_p, full = self.ladder[self.level]
        if tree is None or (self.steps + 1) % self.window:
            return orig(self, emitted, cost)
        # the window's decision, made on emitted plus w steps at the predicted tau
        self.emitted += w * tau_p; self.steps += w
        try:
            orig(self, emitted, cost)
        finally:
            if self.steps:  # a move resets both; staying keeps the prior out of later windows' evidence
                self.emitted -= w * tau_p; self.steps -= w
    return observe
with hold_machine():
    g = EagleGenerator.from_pretrained(tree="auto")
    ids = g.encode(P)
    g.generate(input_ids=ids, max_new_tokens=16)
    variants = {"policy": orig, "prior8": with_prior(8), "prior16": with_prior(16), "fixed": None}
    ts = {k: [] for k in variants}; ts["vanilla"] = []; hist = {}
    for rnd in range(4):
        for name, obs in variants.items():
            g.adaptive = obs is not None
            tuning.AdaptiveTree.observe = obs or orig
            t = time.perf_counter(); r = g.generate(input_ids=ids, max_new_tokens=N); ts[name].append(time.perf_counter() - t)
            hist[name] = (g.last_policy.history if g.last_policy is not None and obs else None, round((len(r.token_ids) - 1) / len(r.steps), 2))
        tuning.AdaptiveTree.observe = orig; g.adaptive = True
        t = time.perf_counter(); g.generate(input_ids=ids, max_new_tokens=N, speculative=False); ts["vanilla"].append(time.perf_counter() - t)
    v = statistics.median(ts["vanilla"])
    for k in variants: print(k, "over vanilla %.2fx" % (v / statistics.median(ts[k])), "history, tau", hist[k])
