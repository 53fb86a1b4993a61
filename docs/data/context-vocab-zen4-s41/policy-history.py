from eaglespec.engine.decoding import EagleGenerator
P = "Explain in a few sentences why the sky is blue."
g = EagleGenerator.from_pretrained(tree="auto")
print("ladder:", [(None if t is None else t.num_nodes, round(tau, 2), round(c * 1e3, 2)) for t, tau, c in __import__("eaglespec.engine.tuning", fromlist=["AdaptiveTree"]).AdaptiveTree.from_tuned(g.tuned).ladder])
r = g.generate(P, max_new_tokens=84)
pol = g.last_policy
print("history (ladder levels):", pol.history)
print("steps:", [(s.tree_size, s.accepted, s.levels) for s in r.steps])
