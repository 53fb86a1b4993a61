"""How steady is the cost curve's 4-token verification ratio at 5 rounds (today's) against 15?
Six curves of each, alternating, in one process, the machine held (tuning.measure_step_costs,
context 256, the tuned trees)."""
import statistics
from eaglespec.pause import hold_machine
from eaglespec.engine import tuning
from eaglespec.engine.decoding import EagleGenerator

with hold_machine():
    g = EagleGenerator.from_pretrained(tree="auto")
    trees = dict(g.tuned.trees)
    out = {5: [], 15: []}
    for i in range(12):
        reps = 5 if i % 2 == 0 else 15
        step, costs, noise = tuning.measure_step_costs(g, trees, context=tuning.COST_CONTEXT, reps=reps)
        v4, full3, full1 = costs[3][1] / step, sum(costs[3]) / step, sum(costs[1]) / step
        out[reps].append((v4, full3, full1))
        print(f"reps {reps:2d}: vanilla {1000 * step:.2f} ms, noise {noise:.3f}, verify(4)/vanilla {v4:.3f}, 3-node step {full3:.3f}x, 1-node step {full1:.3f}x")
    for reps, rows in out.items():
        for k, name in enumerate(("verify(4)", "3-node", "1-node")):
            xs = [r[k] for r in rows]
            print(f"reps {reps}: {name} mean {statistics.mean(xs):.3f}, range {min(xs):.3f}-{max(xs):.3f}, sd {statistics.stdev(xs):.3f}")
