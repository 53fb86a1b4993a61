"""Training steps with the eager and the compiled loss, alternating, in one process, the machine held
(the background lever paused): wall time of each optimizer step's forward+backward (_accumulate)."""
import statistics, time, shutil, torch
from eaglespec.pause import hold_machine
from eaglespec.engine.target import load_target
from eaglespec.train.capture import FeatureDataset
from eaglespec.train.config import TrainConfig
from eaglespec.train import trainer as tr

times = {}
orig = tr.Trainer._accumulate
def timed(self, group):
    t = time.perf_counter(); out = orig(self, group)
    times.setdefault(self._label, []).append(time.perf_counter() - t); return out
tr.Trainer._accumulate = timed
tr.Trainer.evaluate = lambda self: {"kind": "eval", "loss": 0.0, "feature_loss": 0.0, "token_loss": 0.0, "step": 0, "epoch": 0}
target = load_target(None, dtype=torch.float32)
data = FeatureDataset("runs/capture-full", hidden=False)
base = TrainConfig(epochs=5, lr=6e-4, grad_accum=4, warmup=40, loss_vocab=8192, eval_first=128, train_examples=15970,
                   checkpoint_every=10000, max_steps=25)
with hold_machine():
    for rnd in range(2):
        for compile_loss in (False, True):
            label = "compiled" if compile_loss else "eager"
            out = f"/tmp/s45/ab/{label}"
            shutil.rmtree(out, ignore_errors=True)
            t = tr.Trainer(target, data, TrainConfig(**{**base.__dict__, "compile_loss": compile_loss}), out,
                           progress=False, compute_dtype=torch.bfloat16)
            t._label = f"{label} round {rnd}"
            t.run()
            v = times[t._label]
            print(f"{t._label}: {len(v)} steps, median {statistics.median(v[3:]):.3f} s a step (first {v[0]:.2f} s)", flush=True)
