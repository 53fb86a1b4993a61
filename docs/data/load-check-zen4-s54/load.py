# The cost curve's load check on a real machine: tuning._quietest on the default model and head, each try's
# reading of other processes' CPU time printed. usage (from the repository root): python docs/data/load-check-zen4-s54/load.py LABEL
# Session 54 ran it once on a quiet machine ("quiet"), then again one second after starting a busy loop at
# nice 19 for 60 s beside it ("loaded": nice -n 19 python3 -c "import time; end = time.time() + 60; ..." &).
import sys
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.engine import tuning
gen = EagleGenerator.from_pretrained(None, "default", "chain:3")
trees = {1: tuning.static_tree([(0,)]), 3: tuning.static_tree([(0,), (0, 0), (0, 0, 0)])}
reading = tuning._others
def show(before, after, seconds, spare=0):
    others = reading(before, after, seconds, spare)
    print(f"  try: others {others:.2f} cores over {seconds:.1f} s", flush=True)
    return others
tuning._others = show
vanilla, costs, noise, others = tuning._quietest(gen, trees, tuning.COST_REPS, 1)
print(sys.argv[1] if len(sys.argv) > 1 else "", f"vanilla {vanilla*1e3:.2f} ms, 3-node {sum(costs[3])/vanilla:.3f}x, "
      f"noise {noise:.3f}, others {others:.2f}", flush=True)
