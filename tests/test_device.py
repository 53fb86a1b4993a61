"""The parts of the suite with a device path, on the device named by EAGLESPEC_TEST_DEVICE (default
cpu): CI runs them on CPU, `make device-check` on CUDA. Tiny random models in float32 (the dtype
training and tests use on every device); a greedy divergence passes only at a float32 near-tie."""

import os

import pytest
import torch
from conftest import ARCHS, tiny_model
from oracle import OracleDrafter
from test_decoding import PROMPT, SHAPES, random_head
from test_eagle3 import eagle3_head
from test_train_capture import synthetic_examples

from eaglespec.draft.drafter import DraftTree
from eaglespec.draft.heads import load_head
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.engine.target import TargetModel
from eaglespec.tools.device_check import NEAR_TIE, find_divergence
from eaglespec.train.capture import OnlineDataset
from eaglespec.train.config import TrainConfig
from eaglespec.train.trainer import train

DEVICE = os.environ.get("EAGLESPEC_TEST_DEVICE", "cpu")
TIE = NEAR_TIE[torch.float32]
LAYERS = (1, 1, 0)  # EAGLE-3 on the 2-layer tiny models


def device_target(arch: str = "llama", seed: int = 0) -> TargetModel:
    return TargetModel(tiny_model(arch, seed, dtype=torch.float32).to(DEVICE), tokenizer=None, name=f"tiny-{arch}")


@pytest.fixture(scope="module")
def target():
    return device_target()


def assert_lossless(gen, tree, max_new_tokens=32):
    vanilla = gen.generate(input_ids=PROMPT, max_new_tokens=max_new_tokens, speculative=False, stop_token_ids=set())
    eagle = gen.generate(input_ids=PROMPT, max_new_tokens=max_new_tokens, tree=tree, stop_token_ids=set())
    assert len(vanilla.token_ids) == max_new_tokens
    d = find_divergence(gen.target, PROMPT, vanilla.token_ids, eagle.token_ids, TIE)
    assert d is None or d.near_tie, f"EAGLE differs from vanilla on {DEVICE} without a near-tie: {d}"
    return eagle


def test_the_models_are_on_the_device(target):
    assert target.device.type == torch.device(DEVICE).type and target.dtype == torch.float32


@pytest.mark.parametrize("arch", ARCHS)
def test_tree_forward_equals_per_branch_forwards(arch):
    device_target(arch).check_tree_forward()  # raises EagleError when they differ


@pytest.mark.parametrize("tree", ["eagle1", "dynamic:3,4,10"])
def test_greedy_eagle1_equals_vanilla(target, tree):
    gen = EagleGenerator(target, random_head(target).to(DEVICE), tree)
    eagle = assert_lossless(gen, tree)
    assert all(s.tree_size > 1 for s in eagle.steps[:-1])


@pytest.mark.parametrize("tree", ["eagle1", "dynamic:3,4,10"])
def test_greedy_eagle3_equals_vanilla(target, tree):
    gen = EagleGenerator(target, eagle3_head(target).to(DEVICE), tree)
    eagle = assert_lossless(gen, tree)
    assert all(s.tree_size > 1 for s in eagle.steps[:-1])


class _TargetOnDevice:
    """The oracle's view of the target: the token ids it builds on the CPU run on the device."""

    def __init__(self, target):
        self.vocab_size, self._model = target.vocab_size, target.model

    def model(self, ids):
        return self._model(ids.to(DEVICE))


class DeviceOracle(OracleDrafter):
    """The always-right drafter, its tokens on the device as the real drafter's are."""

    def draft_one(self, history, new_tokens, new_features, root) -> DraftTree:
        tree = super().draft_one(history, new_tokens, new_features, root)
        return DraftTree(tree.tokens.to(DEVICE), tree.buffers)


def test_always_right_drafter_is_accepted_in_full(target):
    """The acceptance path (long accepted paths, the cache kept along them) on the device."""
    drafter = DeviceOracle(_TargetOnDevice(target), PROMPT, SHAPES["eagle1"])
    depth = max(len(drafter._ancestors(n)) for n in range(drafter.max_nodes))
    eagle = assert_lossless(EagleGenerator(target, drafter=drafter), "default")
    assert eagle.steps and all(s.accepted == depth for s in eagle.steps[:-1])


@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
def test_a_few_training_steps(target, kind, tmp_path):
    layers = LAYERS if kind == "eagle3" else None
    dataset = OnlineDataset(target, synthetic_examples(6), layers=layers)
    extra = dict(head="eagle3", aux_layers="1,1,0", ttt_steps=2, draft_vocab_size=64) if kind == "eagle3" else {}
    config = TrainConfig(lr=1e-3, warmup=1, grad_accum=1, max_steps=3, eval_fraction=0.2, log_every=1, **extra)
    result = train(target, dataset, config, tmp_path, device=DEVICE, progress=False)
    assert result.steps == 3
    assert all(p.device.type == torch.device(DEVICE).type for p in result.head.parameters())
    losses = [r["loss"] for r in result.history if r["kind"] == "train"]
    assert losses and all(torch.isfinite(torch.tensor(losses)))
    head = load_head(tmp_path, target.config)
    assert head.kind == kind


def test_seeded_sampling_is_reproducible(target):
    gen = EagleGenerator(target, random_head(target).to(DEVICE), "eagle1")
    kwargs = dict(input_ids=PROMPT, max_new_tokens=24, temperature=0.8, top_p=0.9, stop_token_ids=set())
    a = gen.generate(seed=3, **kwargs)
    b = gen.generate(seed=3, **kwargs)
    assert a.token_ids == b.token_ids and len(a.token_ids) == 24
    v1 = gen.generate(seed=5, speculative=False, **kwargs)
    v2 = gen.generate(seed=5, speculative=False, **kwargs)
    assert v1.token_ids == v2.token_ids
