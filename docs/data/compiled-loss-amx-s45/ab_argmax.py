"""Training steps of the recipe with the hit count by argmax (before) and by max (greedy_ids), alternating,
in one process, the machine held: wall time of each optimizer step's forward+backward (_accumulate)."""
import statistics, time, shutil, torch
from eaglespec.pause import hold_machine
from eaglespec.engine.target import load_target
from eaglespec.train.capture import FeatureDataset
from eaglespec.train.config import TrainConfig
from eaglespec.train import trainer as tr, loss as ls
from eaglespec.core.verify import greedy_ids

times = {}
orig = tr.Trainer._accumulate
def timed(self, group):
    t = time.perf_counter(); out = orig(self, group)
    times.setdefault(self._label, []).append(time.perf_counter() - t); return out
tr.Trainer._accumulate = timed
tr.Trainer.evaluate = lambda self: {"kind": "eval", "loss": 0.0, "feature_loss": 0.0, "token_loss": 0.0, "step": 0, "epoch": 0}
target = load_target(None, dtype=torch.float32)
data = FeatureDataset("runs/capture-full", hidden=False)
base = dict(epochs=5, lr=6e-4, grad_accum=4, warmup=40, loss_vocab=8192, eval_first=128, train_examples=15970,
            checkpoint_every=10000, max_steps=25)
with hold_machine():
    pair = [("argmax", lambda x: x.argmax(-1)), ("max", greedy_ids)]
    for rnd in range(4):
        for label, fn in (pair if rnd % 2 == 0 else pair[::-1]):
            ls.greedy_ids = fn
            out = f"/tmp/s45/ab/{label}"
            shutil.rmtree(out, ignore_errors=True)
            t = tr.Trainer(target, data, TrainConfig(**base), out, progress=False, compute_dtype=torch.bfloat16)
            t._label = f"{label} round {rnd}"
            r = t.run()
            v = times[t._label]
            print(f"{t._label}: {len(v)} steps, median {statistics.median(v[3:]):.3f} s a step, loss {r.history[-2]['loss']:.6f}", flush=True)
