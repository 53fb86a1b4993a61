"""Data-parallel training on CPU (DDP over gloo, two processes): the weights equal a one-process
run with the same global batch, and a checkpoint moves between process counts.

Float64 heads, so that the only difference, the order in which the gradients of a step's
sequences are summed, stays near 1e-16 (3e-16 measured); the weights are compared within 1e-9,
relative and absolute. The losses are taken in float32 (loss.py), so logged and held-out losses
are compared at float32's precision, 1e-6.

The EAGLE-1 steps cover a global batch split evenly (4 sequences: 2 a process) and one that is
not (the epoch's last sequence alone: the second process contributes a zero gradient), with
feature noise on, across two epochs; the EAGLE-3 steps (whose loss calls the head's methods
rather than its forward) split 3 sequences 2 and 1.
"""

import json
import os
import socket

import pytest
import torch
from safetensors.torch import load_file

from conftest import tiny_target
from eaglespec.draft.contract import WEIGHTS
from eaglespec.train.capture import OnlineDataset
from eaglespec.train.config import TrainConfig
from eaglespec.train.trainer import CHECKPOINT, METRICS, train
from test_train_capture import one_thread, synthetic_examples  # noqa: F401 (autouse fixture)

pytestmark = pytest.mark.skipif(
    not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
    reason="needs torch.distributed with the gloo backend")

# 10 examples: 1 held out, 9 trained on in steps of 4, 4 and 1 sequences per epoch; 6 optimizer steps
CONFIG = TrainConfig(lr=1e-2, warmup=2, grad_accum=4, epochs=2, eval_fraction=0.1, noise=0.1, checkpoint_every=1,
                     log_every=1, eval_depths=2)
FIRST_STEP_ONLY = TrainConfig(**{**CONFIG.__dict__, "time_limit": 1e-9})  # a run stops after its first step
EAGLE3 = TrainConfig(head="eagle3", aux_layers="1,1,0", ttt_steps=3, draft_vocab_size=64, lr=1e-2, warmup=1,
                     grad_accum=3, eval_fraction=0.1, log_every=1)
TOLERANCE = dict(rtol=1e-9, atol=1e-9)


def _setup():
    target = tiny_target(dtype=torch.float64, check=False)
    examples = synthetic_examples(10)
    return target, {"eagle1": OnlineDataset(target, examples), "eagle3": OnlineDataset(target, examples, (1, 1, 0))}


def _train(target, dataset, config, out):
    return train(target, dataset, config, out, progress=False, compute_dtype=torch.float64)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, jobs: list) -> None:
    """One of `world` processes, joined as torchrun's would be (the environment variables that
    `eaglespec train` reads), running the training `jobs` [(config, out_dir)] in turn."""
    import faulthandler
    faulthandler.enable(all_threads=True)  # a process that aborts prints every thread's Python stack
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from eaglespec.train.distributed import process_group

    with process_group("cpu") as (dist, device):
        assert (dist.rank, dist.world_size, device) == (rank, world, "cpu")
        target, datasets = _setup()
        for config, out in jobs:
            _train(target, datasets[config.head], config, out)


def _spawn(jobs: list, world: int = 2) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(world, _free_port(), jobs), nprocs=world, join=True)


def _weights(out) -> dict[str, torch.Tensor]:
    return load_file(out / WEIGHTS)


def _assert_same_run(a, b) -> None:
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    assert all(v.dtype == torch.float64 for v in wa.values() if v.is_floating_point())
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], **TOLERANCE, msg=lambda m: f"{k}: {m}")
    rows_a = [json.loads(line) for line in (a / METRICS).read_text().splitlines()]
    rows_b = [json.loads(line) for line in (b / METRICS).read_text().splitlines()]
    train_a, train_b = ([r for r in rows if r["kind"] == "train"] for rows in (rows_a, rows_b))
    assert [(r["step"], r["epoch"], r["lr"]) for r in train_a] == [(r["step"], r["epoch"], r["lr"]) for r in train_b]
    for ra, rb in zip(train_a, train_b):  # the step losses: every sequence counted once, by one process
        assert rb["loss"] == pytest.approx(ra["loss"], rel=1e-6)
    final_a, final_b = rows_a[-1], rows_b[-1]  # the held-out row, scored on the shares of two processes
    assert final_a["kind"] == final_b["kind"] == "eval" and final_a["positions"] == final_b["positions"]
    assert final_b["loss"] == pytest.approx(final_a["loss"], rel=1e-6)
    assert final_b["acc_depth1"] == final_a["acc_depth1"]


def test_two_processes_train_as_one_and_checkpoints_move_between_process_counts(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the spawned processes inherit it
    target, datasets = _setup()
    dataset = datasets["eagle1"]
    _train(target, dataset, CONFIG, tmp_path / "one")
    _train(target, datasets["eagle3"], EAGLE3, tmp_path / "one3")
    first = _train(target, dataset, FIRST_STEP_ONLY, tmp_path / "1to2")  # 1 step on one process
    assert first.steps == 1 and (tmp_path / "1to2" / CHECKPOINT).is_file()

    micro = {"micro_batch": 2}  # each process's share of a step in one forward (a share of 0 or 1 too)
    _spawn([(CONFIG, tmp_path / "two"),  # 6 steps on two processes
            (EAGLE3, tmp_path / "two3"),  # 3 steps
            (TrainConfig(**{**CONFIG.__dict__, **micro}), tmp_path / "two-micro"),
            (TrainConfig(**{**EAGLE3.__dict__, **micro}), tmp_path / "two3-micro"),
            (CONFIG, tmp_path / "1to2"),  # resumes the one-process checkpoint: steps 2-6
            (FIRST_STEP_ONLY, tmp_path / "2to1")])  # 1 step on two processes, then a checkpoint

    state = torch.load(tmp_path / "2to1" / CHECKPOINT, weights_only=True)
    assert (state["step"], state["epoch"], state["position"]) == (1, 0, 4)  # positions in the global order
    rest = _train(target, dataset, CONFIG, tmp_path / "2to1")  # steps 2-6 on one process
    assert rest.steps == 6

    files = {p.name for p in (tmp_path / "one").iterdir()}
    for out in ("two", "1to2", "2to1", "two-micro"):
        assert {p.name for p in (tmp_path / out).iterdir()} == files  # no checkpoint or temporary file left
        _assert_same_run(tmp_path / "one", tmp_path / out)
    _assert_same_run(tmp_path / "one3", tmp_path / "two3")
    _assert_same_run(tmp_path / "one3", tmp_path / "two3-micro")


def test_eaglespec_train_under_torchrun(tmp_path, request):
    """The documented command, `torchrun --nproc_per_node 2 -m eaglespec.cli train ...`, on a
    tiny float32 model: one process prints, rank 0 writes the head, and the weights are one
    process's. With 2 processes and --grad-accum 2 each process takes one sequence a step and the
    all-reduce adds two halves, so even float32 agrees to rounding."""
    import subprocess
    import sys

    from transformers import AutoTokenizer

    from conftest import tiny_model
    from eaglespec.cli.commands import main
    from eaglespec.engine.target import load_target
    from eaglespec.train.capture import capture
    from eaglespec.train.config import CaptureConfig
    from test_train_data import smol_tokenizer_dir

    tokenizer = AutoTokenizer.from_pretrained(smol_tokenizer_dir(request))
    model_dir = tmp_path / "model"
    tiny_model(dtype=torch.float32, vocab_size=len(tokenizer), hidden_size=32).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    target = load_target(str(model_dir), check=False)
    capture(target, CaptureConfig(data="synthetic", feature_dtype="fp32"), tmp_path / "cap",
            examples=synthetic_examples(7), progress=False)
    args = ["train", "--target", str(model_dir), "--capture-dir", str(tmp_path / "cap"), "--grad-accum", "2",
            "--epochs", "2", "--eval-fraction", "0.2", "--lr", "1e-2", "--warmup", "1", "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "EAGLESPEC_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          "-m", "eaglespec.cli", *args, "--out", str(tmp_path / "two")],
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("wrote head to") == 1  # rank 0 alone reports
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    one, two = _weights(tmp_path / "one"), _weights(tmp_path / "two")
    assert one.keys() == two.keys()
    for k in one:
        torch.testing.assert_close(two[k], one[k], msg=lambda m: f"{k}: {m}")
    extra = json.loads((tmp_path / "two" / "config.json").read_text())["eaglespec"]
    assert extra["steps"] == 6 and extra["split"] == {"train": 5, "eval": 2}  # 3 steps of 2, 2, 1 a epoch
