"""Tree auto-tuning: acceptance calibration, best trees by expected tau, the chosen tree."""

import pytest
import torch
from conftest import tiny_target
from oracle import OracleDrafter

from eaglespec.decoding import EagleGenerator
from eaglespec.draft.head import EagleHead
from eaglespec.errors import EagleError
from eaglespec.tuning import AcceptanceStats, best_trees, calibrate, calibration_tree, tune, use_auto_tree

PROMPT = [5, 17, 33, 9, 64, 21, 7, 90, 11, 3]


def test_best_trees_take_nodes_by_path_probability():
    stats = AcceptanceStats(((0.8, 0.1), (0.5, 0.05)), steps=1)
    trees = best_trees(stats, 4)
    assert [paths for paths, _ in trees][-1] == ((0,), (0, 0), (1,), (1, 0))  # 0.1 * 0.5 > 0.8 * 0.05
    taus = [tau for _, tau in trees]
    assert taus == pytest.approx([1.8, 2.2, 2.3, 2.35])


def test_stats_round_trip(tmp_path):
    stats = AcceptanceStats(((0.5, 0.25),), steps=7)
    stats.save(tmp_path)
    assert AcceptanceStats.load(tmp_path) == stats
    assert AcceptanceStats.load(tmp_path / "nothing") is None


def test_calibration_with_an_always_right_drafter():
    target = tiny_target("llama")
    tree = calibration_tree()
    gen = EagleGenerator(target, drafter=OracleDrafter(target, PROMPT, tree.parents.tolist()))
    stats = calibrate(gen, [PROMPT], max_new_tokens=120, stop_token_ids=set())
    p = torch.tensor(stats.p)
    assert stats.steps > 0
    assert torch.all(p[:, 0] == 1.0)        # rank 0 is always the target's token
    assert torch.all(p[:, 1:] < 0.2)        # random siblings almost never are


def test_tune_prefers_a_chain_when_only_rank_zero_is_ever_right():
    target = tiny_target("llama")
    torch.manual_seed(0)
    gen = EagleGenerator(target, EagleHead(target.config).to(target.dtype), "eagle1")
    stats = AcceptanceStats(tuple((1.0, 0.0, 0.0) for _ in range(4)), steps=1)
    tuned = tune(gen, stats, sizes=(1, 2, 4), reps=1)
    assert all(set(path) == {0} for path in tuned.tree.paths)  # a chain
    assert tuned.predicted_tau == 1 + tuned.tree.num_nodes - 1
    assert [row[0] for row in tuned.table] == [1, 2, 4]
    assert "auto tree" in tuned.describe()


def test_tune_warns_when_nothing_beats_vanilla():
    target = tiny_target("llama")
    torch.manual_seed(0)
    gen = EagleGenerator(target, EagleHead(target.config).to(target.dtype), "eagle1")
    stats = AcceptanceStats(tuple((0.0, 0.0) for _ in range(3)), steps=1)  # never right: tau stays 1
    tuned = tune(gen, stats, sizes=(1, 2), reps=1)
    assert tuned.predicted_tau == 1.0 and tuned.predicted_speedup < 1.0
    assert "slower than vanilla" in tuned.describe()


def test_auto_tree_comes_from_the_head_directory(tmp_path):
    target = tiny_target("llama")
    torch.manual_seed(0)
    head = EagleHead(target.config).to(target.dtype)
    with pytest.raises(EagleError, match="from_pretrained"):
        EagleGenerator(target, head, "auto")
    gen = EagleGenerator(target, head, "eagle1", head_dir=tmp_path)
    use_auto_tree(gen)  # no acceptance.json: EAGLE-1's tree, and the user is told
    assert gen.tuned is None and gen.tree.num_nodes == 26 and "acceptance.json" in gen.head_note
    AcceptanceStats(tuple((1.0, 0.0) for _ in range(3)), steps=1).save(tmp_path)
    use_auto_tree(gen)
    assert gen.tree is gen.tuned.tree and (0,) in gen.tree.paths
    # only rank 0 is ever right: the chosen tree's tau is its rank-0 chain's length + 1
    chain = max(len(path) for path in gen.tree.paths if set(path) == {0})
    assert gen.tuned.predicted_tau == chain + 1 >= 2
    assert gen.generate(input_ids=PROMPT, max_new_tokens=12).token_ids == \
        gen.generate(input_ids=PROMPT, max_new_tokens=12, speculative=False).token_ids


def test_auto_tree_with_an_eagle3_head(tmp_path):
    """Calibration, tuning and the chosen tree run through the head contract, whatever the kind."""
    from test_eagle3 import eagle3_head

    target = tiny_target("qwen3")
    head = eagle3_head(target)
    head.save_pretrained(tmp_path)
    gen = EagleGenerator(target, head, "eagle1", head_dir=tmp_path)
    stats = calibrate(gen, [PROMPT], max_new_tokens=24, stop_token_ids=set())
    assert stats.steps > 0 and len(stats.p) == 6
    stats.save(tmp_path)
    use_auto_tree(gen)
    assert gen.tuned is not None and gen.tree is gen.tuned.tree
    assert gen.generate(input_ids=PROMPT, max_new_tokens=16, stop_token_ids=set()).token_ids == \
        gen.generate(input_ids=PROMPT, max_new_tokens=16, speculative=False, stop_token_ids=set()).token_ids
