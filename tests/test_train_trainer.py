"""Training on tiny random models: the loss falls, resumption is bit-exact, the CLI writes a loadable head."""

import json

import pytest
import torch

from conftest import tiny_model, tiny_target
from eaglespec.draft.contract import read_extra
from eaglespec.draft.head import EagleHead
from eaglespec.errors import EagleError
from eaglespec.train.capture import OnlineDataset
from eaglespec.train.config import TrainConfig
from eaglespec.train.trainer import CHECKPOINT, METRICS, PLOT, Trainer, train
from test_train_capture import Interrupted, one_thread, synthetic_examples  # noqa: F401 (autouse fixture)
from test_train_data import smol_tokenizer_dir


@pytest.fixture(scope="module")
def target():
    return tiny_target(dtype=torch.float32, check=False)


@pytest.fixture(scope="module")
def dataset(target):
    return OnlineDataset(target, synthetic_examples(10))


class FailingDataset:
    """The data set, interrupted on its `reads`-th read."""

    def __init__(self, dataset, reads):
        self.dataset, self.reads, self.identity = dataset, reads, dataset.identity
        self.layers = getattr(dataset, "layers", None)

    def __len__(self):
        return len(self.dataset)

    def tokens(self, i):
        return self.dataset.tokens(i)

    def __getitem__(self, i):
        self.reads -= 1
        if self.reads < 0:
            raise Interrupted
        return self.dataset[i]


def test_a_few_steps_reduce_the_loss(target, dataset, tmp_path):
    config = TrainConfig(lr=3e-3, warmup=1, grad_accum=1, epochs=4, noise=0.0, eval_fraction=0.2, log_every=1)
    trainer = Trainer(target, dataset, config, tmp_path, progress=False)
    trainer.eval_idx = trainer.train_idx  # random tokens do not generalise: measure the fit
    before = trainer.evaluate()
    result = trainer.run()
    after = result.final_eval
    assert after["loss"] < 0.9 * before["loss"]
    assert after["acc_depth1"] > before["acc_depth1"]
    assert after["step"] == result.steps == 4 * 8
    assert {"acc_depth1", "acc_depth4"} <= set(after) and 0.0 <= after["acc_depth1"] <= 1.0
    rows = [json.loads(line) for line in (tmp_path / METRICS).read_text().splitlines()]
    assert [r["kind"] for r in rows].count("eval") == 4 and rows == result.history
    assert not (tmp_path / CHECKPOINT).exists()
    from matplotlib.image import imread

    image = imread(tmp_path / PLOT)  # a real picture: decodes, has a size, is not blank
    assert image.shape[0] > 200 and image.shape[1] > 200 and image.std() > 0.01
    extra = read_extra(tmp_path)
    assert extra["target"] == target.identity() and extra["steps"] == 32


def test_noise_is_uniform_and_the_target_stays_frozen(target, dataset, tmp_path):
    trainer = Trainer(target, dataset, TrainConfig(noise=0.1, max_steps=2, grad_accum=1, warmup=1, lr=1e-2),
                      tmp_path, progress=False)
    noise = trainer._noisy(torch.zeros(20000, 4))
    assert noise.abs().max() <= 0.1 and noise.min() < -0.099 and noise.max() > 0.099
    assert abs(noise.mean()) < 0.002 and noise.var().item() == pytest.approx(0.1 ** 2 / 3, rel=0.03)  # U(-a, a)
    optimized = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in trainer.head.parameters()}
    assert not any(p.requires_grad for p in target.model.parameters())
    frozen = {k: v.clone() for k, v in target.model.state_dict().items()}
    head_before = {k: v.clone() for k, v in trainer.head.state_dict().items()}
    trainer.run()
    assert all(torch.equal(v, target.model.state_dict()[k]) for k, v in frozen.items())
    assert not all(torch.equal(v, trainer.head.state_dict()[k]) for k, v in head_before.items())
    assert not any("embed" in k or "lm_head" in k for k in trainer.head.state_dict())


def test_resume_is_bit_exact(target, dataset, tmp_path):
    config = TrainConfig(lr=1e-3, warmup=2, grad_accum=3, epochs=2, eval_fraction=0.2, checkpoint_every=1, log_every=2)
    whole = train(target, dataset, config, tmp_path / "whole", progress=False)
    with pytest.raises(Interrupted):  # in epoch 1 (after 8 reads of epoch 0 and 2 held-out reads), mid-step
        train(target, FailingDataset(dataset, reads=8 + 2 + 4), config, tmp_path / "cut", progress=False)
    assert (tmp_path / "cut" / CHECKPOINT).exists()
    state = torch.load(tmp_path / "cut" / CHECKPOINT, weights_only=True)
    assert (state["epoch"], state["position"], state["step"]) == (1, 3, 4)
    with pytest.raises(EagleError, match="other training options \\(lr\\)"):
        train(target, dataset, TrainConfig(**{**config.__dict__, "lr": 2e-3}), tmp_path / "cut", progress=False)
    cut = train(target, dataset, config, tmp_path / "cut", progress=False)
    a, b = whole.head.state_dict(), cut.head.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert whole.history == cut.history and whole.steps == cut.steps == 6


def test_train_examples_cuts_the_training_split_and_keeps_the_held_out_one(target, dataset, tmp_path):
    whole = Trainer(target, dataset, TrainConfig(eval_fraction=0.2), tmp_path / "a", progress=False)
    part = Trainer(target, dataset, TrainConfig(eval_fraction=0.2, train_examples=3), tmp_path / "b", progress=False)
    assert part.eval_idx == whole.eval_idx and part.train_idx == whole.train_idx[:3]
    assert part.steps_per_epoch == 1 and whole.steps_per_epoch == 1  # 3 and 8 sequences at grad_accum 8
    with pytest.raises(EagleError, match="--train-examples 9 is more than the 8 examples"):
        Trainer(target, dataset, TrainConfig(eval_fraction=0.2, train_examples=9), tmp_path / "c", progress=False)
    with pytest.raises(EagleError, match="train_examples=0"):
        TrainConfig(train_examples=0)


def test_eval_first_keeps_one_held_out_set_while_the_data_grows(target, dataset, tmp_path):
    class Prefix:  # the first n examples of the data set: a capture seen earlier in its growth
        def __init__(self, n):
            self.n, self.identity = n, dataset.identity

        def __len__(self):
            return self.n

        def __getattr__(self, name):
            return getattr(dataset, name)

    assert len(dataset) == 10
    config = TrainConfig(eval_first=2)
    small, large = (Trainer(target, data, config, tmp_path / str(len(data)), progress=False)
                    for data in (Prefix(6), dataset))
    assert small.eval_idx == large.eval_idx == [0, 1]
    assert small.train_idx == [2, 3, 4, 5] and large.train_idx == list(range(2, 10))
    with pytest.raises(EagleError, match="--eval-first 10 holds out all 10 examples"):
        Trainer(target, dataset, TrainConfig(eval_first=10), tmp_path / "x", progress=False)
    with pytest.raises(EagleError, match="eval_first=0"):
        TrainConfig(eval_first=0)


class Prefix:
    """The first n examples of a data set: a capture seen earlier in its growth."""

    def __init__(self, dataset, n):
        self.dataset, self.n, self.identity = dataset, n, dataset.identity

    def __len__(self):
        return self.n

    def __getattr__(self, name):
        return getattr(self.dataset, name)

    def __getitem__(self, i):
        return self.dataset[i]


def test_a_scaling_point_resumes_on_a_capture_that_grew(target, dataset, tmp_path):
    """With --eval-first and --train-examples a run reads the capture's first examples only: it
    resumes bit-exact after the capture grew (as a scaling point's does), and is refused when
    what it read changed. Without --train-examples the growth is other data."""
    config = TrainConfig(lr=1e-3, warmup=1, grad_accum=1, epochs=2, eval_first=2, train_examples=3, checkpoint_every=1)
    whole = train(target, dataset, config, tmp_path / "whole", progress=False)
    with pytest.raises(Interrupted):
        train(target, FailingDataset(Prefix(dataset, 6), reads=4), config, tmp_path / "cut", progress=False)
    assert torch.load(tmp_path / "cut" / CHECKPOINT, weights_only=True)["step"] >= 1
    cut = train(target, dataset, config, tmp_path / "cut", progress=False)  # 10 examples now, not 6
    assert all(torch.equal(v, cut.head.state_dict()[k]) for k, v in whole.head.state_dict().items())
    assert whole.history == cut.history

    grown = TrainConfig(**{**config.__dict__, "train_examples": None})
    with pytest.raises(Interrupted):
        train(target, FailingDataset(Prefix(dataset, 6), reads=4), grown, tmp_path / "all", progress=False)
    with pytest.raises(EagleError, match="made on other data"):
        train(target, dataset, grown, tmp_path / "all", progress=False)


def test_a_resume_checks_the_compute_dtype_and_forgives_older_checkpoints(target, dataset, tmp_path):
    """A checkpoint records the compute dtype and device; one made otherwise is refused, naming
    the options to resume with. A checkpoint from before these records (no "run", no "read")
    still resumes. A temporary file left by a killed checkpoint write does not block a start."""
    config = TrainConfig(lr=1e-3, warmup=1, grad_accum=1, epochs=1, eval_fraction=0.2, checkpoint_every=1)
    with pytest.raises(Interrupted):
        train(target, FailingDataset(dataset, reads=3), config, tmp_path / "cut", progress=False)
    path = tmp_path / "cut" / CHECKPOINT
    state = torch.load(path, weights_only=True)
    assert state["run"] == {"compute_dtype": "float32", "device": "cpu"} and "read" in state["data"]
    torch.save({**state, "run": {"compute_dtype": "bfloat16", "device": "cpu"}}, path)
    with pytest.raises(EagleError, match="compute dtype bfloat16 on cpu, this run has float32 on cpu: resume with "
                                         "--compute-dtype bfloat16"):
        train(target, dataset, config, tmp_path / "cut", progress=False)
    older = {k: v for k, v in state.items() if k != "run"}
    older["data"] = {k: v for k, v in state["data"].items() if k != "read"}
    torch.save(older, path)
    (tmp_path / "cut" / ".checkpoint.pt.x1y2.tmp").write_bytes(b"cut short")
    assert train(target, dataset, config, tmp_path / "cut", progress=False).steps == 8
    assert not list((tmp_path / "cut").glob(".*.tmp"))
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / ".checkpoint.pt.x1y2.tmp").write_bytes(b"cut short")
    assert train(target, dataset, config, tmp_path / "new", progress=False).steps == 8


def test_output_directory_rules(target, dataset, tmp_path):
    config = TrainConfig(max_steps=1, grad_accum=2, eval_fraction=0.2)
    train(target, dataset, config, tmp_path, progress=False)
    with pytest.raises(EagleError, match="not empty.*--overwrite"):
        train(target, dataset, config, tmp_path, progress=False)
    (tmp_path / "notes.txt").write_text("kept")
    train(target, dataset, config, tmp_path, overwrite=True, progress=False)
    assert (tmp_path / "notes.txt").read_text() == "kept"
    other = tiny_target(seed=1, dtype=torch.float32, check=False)
    with pytest.raises(EagleError, match="training data was made for target"):
        Trainer(other, dataset, config, tmp_path / "x", progress=False)


def test_cli_capture_then_train_writes_a_loadable_head(tmp_path, request, capsys):
    """The whole command line on a tiny random model that carries SmolLM2's tokenizer and template."""
    from transformers import AutoTokenizer

    from eaglespec.engine.target import load_target
    from eaglespec.train.cli import main

    tokenizer = AutoTokenizer.from_pretrained(smol_tokenizer_dir(request))
    model_dir = tmp_path / "model"
    tiny_model(dtype=torch.float32, vocab_size=len(tokenizer), hidden_size=32).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    rows = [{"conversations": [{"from": "human", "value": f"What is {i} plus {i}?"},
                               {"from": "gpt", "value": f"{i} plus {i} is {2 * i}."}]} for i in range(6)]
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = ["--target", str(model_dir), "--no-progress"]
    from eaglespec.train import capture as capture_module

    opened = []  # (head, whether the fused layers are read): EAGLE-1 runs leave them unread
    real_init = capture_module.FeatureDataset.__init__

    def spy(self, directory, partial=False, hidden=True):
        opened.append(hidden)
        real_init(self, directory, partial, hidden)
    # the capture keeps two target layers too, so the EAGLE-1 run below reads only its features and
    # an EAGLE-3 run reads the layers through the same command line
    assert main(["capture", *common, "--data", str(data), "--out", str(tmp_path / "cap"), "--shard-size", "4",
                 "--aux-layers", "1,1,0"]) == 0
    capture_module.FeatureDataset.__init__ = spy
    try:
        assert main(["train", *common, "--capture-dir", str(tmp_path / "cap"), "--out", str(tmp_path / "head"),
                     "--grad-accum", "2", "--eval-fraction", "0.2", "--epochs", "2"]) == 0
        assert main(["train", *common, "--capture-dir", str(tmp_path / "cap"), "--out", str(tmp_path / "head3"),
                     "--head", "eagle3", "--aux-layers", "1,1,0", "--ttt-steps", "2", "--draft-vocab-size", "64",
                     "--max-steps", "1"]) == 0
    finally:
        capture_module.FeatureDataset.__init__ = real_init
    assert opened == [False, True]
    assert main(["train", *common, "--online", "--data", str(data), "--out", str(tmp_path / "online"),
                 "--max-steps", "1"]) == 0
    target = load_target(str(model_dir), check=False)
    head = EagleHead.from_pretrained(tmp_path / "head", target.config)
    extra = read_extra(tmp_path / "head")
    assert extra["steps"] == 4 and extra["split"] == {"train": 4, "eval": 2}
    assert extra["data"]["capture_options"]["shard_size"] == 4
    assert isinstance(head, EagleHead)
    from eaglespec.draft.vocab import load_draft_vocab

    ranked = load_draft_vocab(tmp_path / "head", 8, target.vocab_size)
    plus = tokenizer.convert_tokens_to_ids("Ġplus")
    assert plus in ranked.tolist()  # " plus" is in every reply
    # The engine loads the trained head, and its greedy output is vanilla's (float64: no rounding ties).
    from eaglespec.engine.decoding import EagleGenerator
    from test_decoding import assert_same_or_tie

    target64 = load_target(str(model_dir), dtype=torch.float64, check=False)
    head = EagleHead.from_pretrained(tmp_path / "head", target64.config).to(torch.float64)
    gen = EagleGenerator(target64, head, "eagle1")
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 7 plus 7?"}],
                                           add_generation_prompt=True, return_dict=False)
    vanilla = gen.generate(input_ids=prompt, max_new_tokens=24, speculative=False, stop_token_ids=set())
    eagle = gen.generate(input_ids=prompt, max_new_tokens=24, stop_token_ids=set())
    assert len(vanilla.token_ids) == 24
    assert_same_or_tie(target64, prompt, vanilla.token_ids, eagle.token_ids)
    # ... and so does the package's own command line
    from eaglespec.cli.commands import main as eaglespec_main

    capsys.readouterr()
    assert eaglespec_main(["generate", "--target", str(model_dir), "--head", str(tmp_path / "head"), "--tree", "eagle1",
                           "--prompt", "What is 7 plus 7?", "--max-new-tokens", "16", "--compare-vanilla"]) == 0
    err = capsys.readouterr().err
    assert "tree=eagle1" in err and "output=identical" in err and "random" not in err
    assert "medians of 3 back-to-back rounds" in err  # the speedup of paired runs, not of one pair
    assert eaglespec_main(["generate", "--target", str(model_dir), "--head", str(tmp_path / "head"), "--tree", "eagle1",
                           "--max-new-tokens", "4", "--compare-vanilla", "--compare-rounds", "0"]) == 2
    assert "--compare-rounds must be >= 1" in capsys.readouterr().err
    # bad input loses nothing: a wrong --data writes no manifest and --overwrite keeps the old capture
    cap_files = {f.name: f.read_bytes() for f in (tmp_path / "cap").iterdir()}
    for out, extra in ((tmp_path / "cap2", []), (tmp_path / "cap", ["--overwrite"])):
        assert eaglespec_main(["capture", *common, "--data", str(tmp_path / "missing.jsonl"), "--out", str(out), *extra]) == 2
        assert "missing.jsonl" in capsys.readouterr().err
    assert not (tmp_path / "cap2" / "manifest.json").exists()
    assert {f.name: f.read_bytes() for f in (tmp_path / "cap").iterdir()} == cap_files
    head_files = {f.name: f.read_bytes() for f in (tmp_path / "head").iterdir()}
    assert eaglespec_main(["train", *common, "--capture-dir", str(tmp_path / "cap"), "--out", str(tmp_path / "head")]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert {f.name: f.read_bytes() for f in (tmp_path / "head").iterdir()} == head_files
    with pytest.raises(SystemExit):
        main(["train", *common, "--capture-dir", str(tmp_path / "cap"), "--out", str(tmp_path / "x"), "--max-length", "9"])
    assert "choose the data of --online" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", *common, "--online", "--data", str(data), "--out", str(tmp_path / "online")])
    assert "is not empty and holds no checkpoint to resume: pass --overwrite" in capsys.readouterr().err


def test_reduced_loss_vocabulary_uses_the_most_frequent_rows(target, dataset, tmp_path):
    config = TrainConfig(lr=3e-3, warmup=1, grad_accum=1, epochs=2, noise=0.0, eval_fraction=0.2, loss_vocab=16)
    trainer = Trainer(target, dataset, config, tmp_path, progress=False)
    keep = torch.sort(trainer.counts, descending=True, stable=True).indices[:16]
    assert trainer.lm_head.weight.shape == (16, target.hidden_size)
    torch.testing.assert_close(trainer.lm_head.weight, target.lm_head.weight[keep])
    before = trainer.evaluate()
    after = trainer.run().final_eval
    assert after["token_loss"] < before["token_loss"]
    assert Trainer(target, dataset, TrainConfig(), tmp_path / "full", progress=False).lm_head is target.lm_head


class OneAtATime(FailingDataset):
    """The data set without its batched read (`samples`): each sequence from its own forward."""

    def __init__(self, dataset):
        super().__init__(dataset, reads=10 ** 9)


@pytest.mark.parametrize("head", ["eagle1", "eagle3"])
def test_a_micro_batch_takes_the_steps_one_sequence_at_a_time_takes(head, tmp_path):
    """Sequences of 8-23 tokens, right-padded 3 to a forward (grad_accum 4: micro-batches of 3
    and 1): the same weights as one sequence per forward, in float64. Pooling the positions of a
    micro-batch instead of averaging each sequence's own would weight long sequences more and
    part the runs; so would padding that reached a real position."""
    target64 = tiny_target(dtype=torch.float64, check=False)
    data = OnlineDataset(target64, synthetic_examples(10), layers=(1, 1, 0) if head == "eagle3" else None)
    extra = dict(head="eagle3", aux_layers="1,1,0", ttt_steps=3, draft_vocab_size=64) if head == "eagle3" else {}
    config = TrainConfig(lr=3e-3, warmup=1, grad_accum=4, epochs=2, eval_fraction=0.2, log_every=1, **extra)
    runs = {}
    for name, micro, dataset in (("one", 1, data), ("batched", 3, data), ("batched, read apart", 3, OneAtATime(data))):
        cfg = TrainConfig(**{**config.__dict__, "micro_batch": micro})
        runs[name] = train(target64, dataset, cfg, tmp_path / name, progress=False, compute_dtype=torch.float64)
    one = runs["one"].head.state_dict()
    assert any(not torch.equal(v, Trainer(target64, data, config, tmp_path / "fresh", progress=False)
                               .head.state_dict()[k]) for k, v in one.items())  # it trained
    for name in ("batched", "batched, read apart"):
        other = runs[name].head.state_dict()
        for k in one:
            torch.testing.assert_close(other[k], one[k], rtol=1e-9, atol=1e-11, msg=f"{name}: {k}")
        losses = [r["loss"] for r in runs[name].history if r["kind"] == "train"]
        # the loss reads fp32 logits (`loss._logits`), so its sums regroup at fp32's precision
        assert losses == pytest.approx([r["loss"] for r in runs["one"].history if r["kind"] == "train"], rel=1e-6)


def test_a_checkpoint_resumes_under_another_micro_batch(tmp_path):
    """Cut in epoch 1, resumed with micro-batches of 2: the uninterrupted run's weights (float64)."""
    target64 = tiny_target(dtype=torch.float64, check=False)
    dataset = OnlineDataset(target64, synthetic_examples(10))
    config = TrainConfig(lr=1e-3, warmup=2, grad_accum=3, epochs=2, eval_fraction=0.2, checkpoint_every=1)
    run = dict(progress=False, compute_dtype=torch.float64)
    whole = train(target64, dataset, config, tmp_path / "whole", **run)
    with pytest.raises(Interrupted):
        train(target64, FailingDataset(dataset, reads=8 + 2 + 4), config, tmp_path / "cut", **run)
    with pytest.raises(EagleError, match=r"other training options \(lr\)"):  # micro_batch is not listed
        train(target64, dataset, TrainConfig(**{**config.__dict__, "lr": 2e-3, "micro_batch": 2}), tmp_path / "cut", **run)
    resumed = train(target64, dataset, TrainConfig(**{**config.__dict__, "micro_batch": 2}), tmp_path / "cut", **run)
    assert resumed.steps == whole.steps == 6
    a, b = whole.head.state_dict(), resumed.head.state_dict()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-9, atol=1e-11, msg=k)
    with pytest.raises(EagleError, match="--micro-batch 1 or more"):
        TrainConfig(micro_batch=0)


def test_init_from_a_head_of_fewer_layers_grows_it_and_drafts_as_it_did_at_first(target, dataset, tmp_path):
    """--head-layers 2 --init-from a one-layer head: its fc and layer come first, the new layer
    starts as the identity (the first evaluation is the given head's), then trains; the grown head
    saves as two layers, and a one-layer run refuses it."""
    from eaglespec.draft.heads import load_head

    config = TrainConfig(lr=3e-3, warmup=1, grad_accum=2, epochs=1, noise=0.0, eval_first=2)
    first = train(target, dataset, config, tmp_path / "first", progress=False)
    grown = Trainer(target, dataset, TrainConfig(**{**config.__dict__, "init_from": str(tmp_path / "first"), "head_layers": 2}),
                    tmp_path / "grown", progress=False)
    assert grown.head.layers == 2
    assert grown.evaluate()["loss"] == pytest.approx(first.final_eval["loss"], rel=1e-6)
    o_proj = grown.head.decoder.layers[1].self_attn.o_proj.weight
    assert not o_proj.any()  # the identity's
    result = grown.run()
    assert result.steps == first.steps and o_proj.any()  # it trained
    assert load_head(tmp_path / "grown", target.config).layers == 2
    with pytest.raises(EagleError, match="its tensors differ from the head this run builds \\(decoder.layers.1"):
        Trainer(target, dataset, TrainConfig(init_from=str(tmp_path / "grown")), tmp_path / "y", progress=False)
    with pytest.raises(EagleError, match="its tensors differ from the head this run builds \\(fc.bias\\)"):
        Trainer(target, dataset, TrainConfig(init_from=str(tmp_path / "first"), head_layers=2, fc_bias=False),
                tmp_path / "w", progress=False)  # growing keeps the other options: not the identity's error
    with pytest.raises(EagleError, match="an EAGLE-3 head has one decoder layer"):
        TrainConfig(head="eagle3", head_layers=2)
    with pytest.raises(EagleError, match="an EAGLE-1 head has 1 to 4 decoder layers"):
        TrainConfig(head_layers=0)


def test_init_from_continues_a_trained_head_and_refuses_another(target, dataset, tmp_path):
    config = TrainConfig(lr=3e-3, warmup=1, grad_accum=2, epochs=1, noise=0.0, eval_first=2)
    first = train(target, dataset, config, tmp_path / "first", progress=False)
    fresh = Trainer(target, dataset, config, tmp_path / "fresh", progress=False)
    cont = Trainer(target, dataset, TrainConfig(**{**config.__dict__, "init_from": str(tmp_path / "first")}),
                   tmp_path / "cont", progress=False)
    a, b, c = first.head.state_dict(), cont.head.state_dict(), fresh.head.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)  # starts where the first run ended
    assert not all(torch.equal(a[k], c[k]) for k in a)  # not where a fresh head starts
    assert cont.evaluate()["loss"] == pytest.approx(first.final_eval["loss"], rel=1e-6)
    result = cont.run()
    assert result.steps == first.steps and read_extra(tmp_path / "cont")["train_config"]["init_from"] == str(tmp_path / "first")
    with pytest.raises(EagleError, match="--init-from .*nowhere: no head folder there"):
        Trainer(target, dataset, TrainConfig(init_from=str(tmp_path / "nowhere")), tmp_path / "x", progress=False)
    with pytest.raises(EagleError, match="its tensors differ from the head this run builds \\(fc.bias\\)"):
        Trainer(target, dataset, TrainConfig(init_from=str(tmp_path / "first"), fc_bias=False), tmp_path / "y", progress=False)
    config_path = tmp_path / "first" / "config.json"
    cfg = json.loads(config_path.read_text())
    cfg["eaglespec"]["target"]["fingerprint"] = "v2-another"
    config_path.write_text(json.dumps(cfg))
    with pytest.raises(EagleError, match="trained for another target \\(fingerprint v2-another"):
        Trainer(target, dataset, TrainConfig(init_from=str(tmp_path / "first")), tmp_path / "z", progress=False)
