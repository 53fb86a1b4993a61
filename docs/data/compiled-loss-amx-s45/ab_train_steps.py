"""Whole optimizer steps of the recipe (4 sequences each, runs/capture-full, bf16 autocast), two variants
alternating in one process with the machine held (the background lever paused): the median wall time of a
step's forward and backward (Trainer._accumulate), evaluation stubbed out.

    python ab_train_steps.py argmax         # the top-1 hit count by argmax against greedy_ids (max); 4 rounds
    python ab_train_steps.py compile-loss   # eager loss against the trial --compile-loss; 2 rounds. Needs the
                                            # dropped patch (TrainConfig.compile_loss, loss.compiled_position_losses)
"""
import shutil, statistics, sys, tempfile, time

import torch

from eaglespec.core.verify import greedy_ids
from eaglespec.engine.target import load_target
from eaglespec.pause import hold_machine
from eaglespec.train import loss as ls, trainer as tr
from eaglespec.train.capture import FeatureDataset
from eaglespec.train.config import TrainConfig

RECIPE = dict(epochs=5, lr=6e-4, grad_accum=4, warmup=40, loss_vocab=8192, eval_first=128, train_examples=15970,
              checkpoint_every=10000, max_steps=25)
mode = sys.argv[1]
if mode == "argmax":  # (label, what to set before the run, config changes), 4 rounds, order alternating
    variants, rounds = [("argmax", lambda: setattr(ls, "greedy_ids", lambda x: x.argmax(-1)), {}),
                        ("max", lambda: setattr(ls, "greedy_ids", greedy_ids), {})], 4
else:
    variants, rounds = [("eager", lambda: None, {}), ("compiled", lambda: None, {"compile_loss": True})], 2

times = {}
accumulate = tr.Trainer._accumulate
def timed(self, group):
    t = time.perf_counter(); out = accumulate(self, group)
    times.setdefault(self.label, []).append(time.perf_counter() - t); return out
tr.Trainer._accumulate = timed
tr.Trainer.evaluate = lambda self: {"kind": "eval", "loss": 0.0, "feature_loss": 0.0, "token_loss": 0.0, "step": 0, "epoch": 0}
target = load_target(None, dtype=torch.float32)
data = FeatureDataset("runs/capture-full", hidden=False)
work = tempfile.mkdtemp(prefix="ab-train-steps-")
with hold_machine():
    for rnd in range(rounds):
        for label, prepare, changes in (variants if rnd % 2 == 0 or mode != "argmax" else variants[::-1]):
            prepare()
            out = f"{work}/{label}"
            shutil.rmtree(out, ignore_errors=True)
            t = tr.Trainer(target, data, TrainConfig(**RECIPE, **changes), out, progress=False, compute_dtype=torch.bfloat16)
            t.label = f"{label} round {rnd}"
            r = t.run()
            v = times[t.label]
            print(f"{t.label}: {len(v)} steps, median {statistics.median(v[3:]):.3f} s a step, loss {r.history[-2]['loss']:.6f}",
                  flush=True)
shutil.rmtree(work, ignore_errors=True)
