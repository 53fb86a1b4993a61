"""EAGLE-3 training on tiny random models: the training-time-test loss against a plain unrolled
reference, the loss falls, resumption is bit-exact, capture stores the fused layers, refusals."""

import pytest
import torch
from conftest import tiny_target
from test_eagle3 import unrolled_reference
from test_train_capture import Interrupted, one_thread, synthetic_examples  # noqa: F401 (autouse fixture)
from test_train_trainer import FailingDataset

from eaglespec.draft.heads import load_head
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.errors import EagleError
from eaglespec.train.capture import FeatureDataset, OnlineDataset, capture
from eaglespec.train.config import CaptureConfig, TrainConfig
from eaglespec.train.loss import collate, head_inputs, ttt_loss
from eaglespec.train.trainer import CHECKPOINT, Trainer, train

LAYERS = (1, 1, 0)  # the tiny models have 2 layers: vLLM ids 0 (embeddings) and 1


@pytest.fixture(scope="module")
def target():
    return tiny_target(dtype=torch.float32, check=False)


@pytest.fixture(scope="module")
def dataset(target):
    return OnlineDataset(target, synthetic_examples(10), layers=LAYERS)


def eagle3_config(**kw):
    base = dict(head="eagle3", aux_layers="1,1,0", ttt_steps=3, draft_vocab_size=64, lr=3e-3, warmup=1,
                grad_accum=1, eval_fraction=0.2)
    return TrainConfig(**{**base, **kw})


def test_ttt_loss_equals_the_unrolled_reference(target, dataset, tmp_path):
    trainer = Trainer(target, dataset, eagle3_config(), tmp_path, progress=False)
    head, sample = trainer.head, dataset[0]
    inputs = head_inputs(sample.input_ids, sample.loss_mask, sample.features, target.embed_tokens, torch.float32,
                         "cpu", hidden=sample.hidden)
    parts = ttt_loss(head, inputs, trainer.lm_head, 3, 0.8)
    # plain: every context end t, the drafter's own chain, each step scored on its own column
    hidden = head.encode(inputs.features)
    outs = unrolled_reference(head, inputs.embeds, hidden, inputs.embeds, 3)  # [3, T-1, H]
    p = trainer.lm_head(inputs.target[0]).softmax(-1)  # p over x[t+2] at column t
    mask, n = inputs.mask[0], inputs.embeds.shape[1]
    expected = 0.0
    for k in range(3):
        cols = [t for t in range(n - k) if mask[t + k]]
        logq = head.lm_head(head.norm(outs[k, cols])).log_softmax(-1)
        ce = -(p[[c + k for c in cols]] * logq).sum(-1).mean()
        expected = expected + 0.8 ** k * ce
        assert parts.positions[k] == len(cols)
        assert parts.step_loss[k] == pytest.approx(float(ce.detach()), rel=1e-4)
    assert float(parts.loss.detach()) == pytest.approx(float(expected.detach()), rel=1e-4)


def test_a_micro_batch_of_ttt_losses_is_the_sum_of_each_sequences(target, dataset, tmp_path):
    """Three sequences of different lengths, right-padded into one micro-batch; the second counts
    only its first column, so it has positions at step 0 and none at steps 1-2: loss, step
    losses, positions and hits are the sums of the three sequences' own."""
    trainer = Trainer(target, dataset, eagle3_config(), tmp_path, progress=False)
    seqs = []
    for i in (0, 1, 2):
        s = dataset[i]
        seqs.append(head_inputs(s.input_ids, s.loss_mask, s.features, target.embed_tokens, torch.float32, "cpu",
                                hidden=s.hidden))
    seqs[1].mask[:] = False
    seqs[1].mask[0, 0] = True
    assert len({x.embeds.shape[1] for x in seqs}) == 3
    alone = [ttt_loss(trainer.head, x, trainer.lm_head, 3, 0.8) for x in seqs]
    assert alone[1].positions == [1, 0, 0]
    batched = ttt_loss(trainer.head, collate(seqs), trainer.lm_head, 3, 0.8)
    assert batched.token_loss.item() == pytest.approx(sum(a.token_loss.item() for a in alone), rel=1e-5)
    assert batched.positions == [sum(a.positions[k] for a in alone) for k in range(3)]
    assert batched.correct == [sum(a.correct[k] for a in alone) for k in range(3)]
    assert batched.step_loss == pytest.approx([sum(a.step_loss[k] for a in alone) for k in range(3)], rel=1e-5)
    grads = []
    for parts in (batched, None):
        trainer.head.zero_grad()
        if parts is None:
            for x in seqs:
                ttt_loss(trainer.head, x, trainer.lm_head, 3, 0.8).loss.backward()
        else:
            parts.loss.backward()
        grads.append({k: p.grad.clone() for k, p in trainer.head.named_parameters() if p.grad is not None})
    for k in grads[1]:
        torch.testing.assert_close(grads[0][k], grads[1][k], rtol=1e-4, atol=1e-6, msg=k)


def test_training_reduces_the_loss_and_writes_an_eagle3_head(target, dataset, tmp_path):
    config = eagle3_config(epochs=6, lr=1e-2, log_every=1)
    trainer = Trainer(target, dataset, config, tmp_path, progress=False)
    assert trainer.config.feature_noise == 0.0  # training-time test replaces the noise
    ids = trainer.head.target_ids()  # the read-out starts as the target's
    torch.testing.assert_close(trainer.head.lm_head.weight, target.lm_head.weight[ids])
    torch.testing.assert_close(trainer.head.norm.weight, target.decoder.norm.weight)
    trainer.eval_idx = trainer.train_idx  # random tokens do not generalise: measure the fit
    before = trainer.evaluate()
    after = trainer.run().final_eval
    assert after["loss"] < 0.95 * before["loss"] and after["acc_depth1"] > before["acc_depth1"] + 0.1
    assert {f"acc_depth{k}" for k in (1, 2, 3, 4)} <= set(after)  # max(eval_depths, ttt_steps)
    assert not (tmp_path / "draft_vocab.safetensors").exists()  # engines load every *.safetensors
    head = load_head(tmp_path, target.config)
    assert head.kind == "eagle3" and head.hidden_layers == LAYERS
    counts = trainer.counts
    assert set(head.target_ids().tolist()) == set(torch.sort(counts, descending=True, stable=True).indices[:64].tolist())
    gen = EagleGenerator(target, head, "chain:3")
    prompt = synthetic_examples(1, seed=3)[0].input_ids.tolist()
    vanilla = gen.generate(input_ids=prompt, max_new_tokens=20, speculative=False, stop_token_ids=set())
    eagle = gen.generate(input_ids=prompt, max_new_tokens=20, stop_token_ids=set())
    assert vanilla.token_ids == eagle.token_ids


def test_resume_is_bit_exact(target, dataset, tmp_path):
    config = eagle3_config(lr=1e-3, grad_accum=3, epochs=2, checkpoint_every=1, log_every=2)
    whole = train(target, dataset, config, tmp_path / "whole", progress=False)
    with pytest.raises(Interrupted):
        train(target, FailingDataset(dataset, reads=8 + 2 + 4), config, tmp_path / "cut", progress=False)
    assert (tmp_path / "cut" / CHECKPOINT).exists()
    cut = train(target, dataset, config, tmp_path / "cut", progress=False)
    a, b = whole.head.state_dict(), cut.head.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert whole.history == cut.history


def test_capture_stores_the_fused_layers_and_training_checks_them(target, tmp_path):
    examples = synthetic_examples(5)
    config = CaptureConfig(data="synthetic", shard_size=2, aux_layers="1,1,0", feature_dtype="fp32")
    manifest = capture(target, config, tmp_path / "cap", examples=examples, progress=False)
    assert manifest["aux_layers"] == [1, 1, 0]
    data = FeatureDataset(tmp_path / "cap")
    states = target.capture_states(examples[3].input_ids[None], layers=LAYERS)
    torch.testing.assert_close(data[3].hidden, states.hidden[0])
    torch.testing.assert_close(data[3].features, states.features[0])
    train(target, data, eagle3_config(max_steps=2), tmp_path / "head", progress=False)
    features_only = FeatureDataset(tmp_path / "cap", hidden=False)  # what an EAGLE-1 run reads of it
    assert features_only[3].hidden is None and features_only.layers == (1, 1, 0)
    torch.testing.assert_close(features_only[3].features, data[3].features)
    with pytest.raises(EagleError, match="capture with --aux-layers 1,0,1"):
        Trainer(target, data, eagle3_config(aux_layers="1,0,1"), tmp_path / "other", progress=False)
    plain = capture(target, CaptureConfig(data="synthetic"), tmp_path / "plain", examples=examples, progress=False)
    assert plain["aux_layers"] is None
    with pytest.raises(EagleError, match="holds none"):
        Trainer(target, FeatureDataset(tmp_path / "plain"), eagle3_config(), tmp_path / "x", progress=False)
    files = {p.name: p.read_bytes() for p in (tmp_path / "cap").iterdir()}
    with pytest.raises(EagleError, match="other options \\(aux_layers\\)"):  # resuming with other layers
        capture(target, CaptureConfig(data="synthetic", shard_size=2, aux_layers="auto", feature_dtype="fp32"),
                tmp_path / "cap", examples=examples, progress=False)
    assert {p.name: p.read_bytes() for p in (tmp_path / "cap").iterdir()} == files
    with pytest.raises(EagleError, match="must be in 0..1"):
        capture(target, CaptureConfig(data="synthetic", aux_layers="0,5,1"), tmp_path / "bad", examples=examples,
                progress=False)
    assert not (tmp_path / "bad").exists()


def test_a_time_limited_run_saves_a_head_and_continues(target, dataset, tmp_path):
    config = eagle3_config(lr=1e-3, grad_accum=2, epochs=1, log_every=1)
    whole = train(target, dataset, config, tmp_path / "whole", progress=False)
    limited = TrainConfig(**{**config.__dict__, "time_limit": 1e-9})  # stops after its first step
    first = train(target, dataset, limited, tmp_path / "cut", progress=False)
    assert first.steps == 1 and (tmp_path / "cut" / CHECKPOINT).exists()
    assert load_head(tmp_path / "cut", target.config).kind == "eagle3"  # a usable head already
    rest = train(target, dataset, config, tmp_path / "cut", progress=False)  # the same command, no limit
    assert rest.steps == whole.steps and not (tmp_path / "cut" / CHECKPOINT).exists()
    a, b = whole.head.state_dict(), rest.head.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
