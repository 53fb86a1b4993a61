"""Tree auto-tuning: acceptance calibration, best trees by expected tau, the chosen tree."""

import json
import os
import time
from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_target
from oracle import OracleDrafter

from eaglespec.draft.drafter import Drafter
from eaglespec.draft.head import EagleHead
from eaglespec.engine import tuning
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.engine.tuning import _cpu_seconds as real_cpu_seconds  # before conftest turns the reading off
from eaglespec.engine.tuning import (AcceptanceStats, best_trees, calibrate, calibration_tree, cost_file, cost_key, tune,
                                     use_auto_tree)
from eaglespec.errors import EagleError
from eaglespec.files import cache_dir

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


def test_tune_warns_when_nothing_beats_vanilla(monkeypatch):
    target = tiny_target("llama")
    torch.manual_seed(0)
    gen = EagleGenerator(target, EagleHead(target.config).to(target.dtype), "eagle1")
    stats = AcceptanceStats(tuple((0.0, 0.0) for _ in range(3)), steps=1)  # never right: tau stays 1
    # a tree step costs more than a vanilla one, as always on a quiet machine (measured under load,
    # a tiny model's 1-node step once timed faster than its vanilla step, and this test failed)
    monkeypatch.setattr(tuning, "measure_step_costs",
                        lambda gen, trees, context=256, reps=3, batch=1: (1.0, {n: (0.1, 1.0 + 0.1 * n) for n in trees}, 0.0))
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


# ---- a damaged acceptance.json ---------------------------------------------------------------
@pytest.mark.parametrize("text, message", [
    ("", "cannot be read as JSON"),
    ('{"p": [[0.5, 0.2], [0.3', "cannot be read as JSON"),
    ("[]", "not an acceptance table"),
    ('{"steps": 3}', "not an acceptance table"),
    ('{"p": [["x"]], "steps": 1}', "not an acceptance table"),
    ('{"p": [[0.5], [0.3, 0.1]], "steps": 1}', "all rows as long"),
    ('{"p": [], "steps": 1}', "non-empty"),
    ('{"p": [[1.5]], "steps": 1}', "outside 0..1"),
])
def test_a_damaged_acceptance_file_is_one_line_naming_it(tmp_path, text, message):
    (tmp_path / "acceptance.json").write_text(text)
    with pytest.raises(EagleError, match=message) as info:
        AcceptanceStats.load(tmp_path)
    text = str(info.value)
    assert "\n" not in text and str(tmp_path / "acceptance.json") in text and "eaglespec tune --head" in text


# ---- the cost curve, cached per machine ------------------------------------------------------
def _tuning_setup(dtype=torch.float64):
    target = tiny_target("llama", dtype=dtype)
    torch.manual_seed(0)
    gen = EagleGenerator(target, EagleHead(target.config).to(target.dtype), "eagle1")
    return gen, AcceptanceStats(tuple((0.9, 0.3) for _ in range(3)), steps=1)


def _count_measurements(monkeypatch):
    """Counts cost-curve measurements (a noisy one is retried inside; that counts once)."""
    calls = []
    real = tuning._quietest

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(tuning, "_quietest", counted)
    return calls


def _no_measuring(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("the cost curve was measured again")

    monkeypatch.setattr(tuning, "measure_step_costs", fail)


def test_the_second_tuning_reads_the_cached_cost_curve(tmp_path, monkeypatch):
    gen, stats = _tuning_setup()
    first = tune(gen, stats, sizes=(1, 2, 4), reps=1, cache=tmp_path)
    assert "measured now" in first.costs_source and str(tmp_path) in first.costs_source
    [path] = tmp_path.glob("step-costs-*.json")
    data = json.loads(path.read_text())
    assert data["key"] == cost_key(gen)
    entry = data["batch_sizes"]["1"]  # room for other batch sizes beside it
    assert set(entry["trees"]) == {"1", "2", "4"} and entry["vanilla"] > 0 and entry["measured_at"]
    _no_measuring(monkeypatch)
    second = tune(gen, stats, sizes=(1, 2, 4), reps=1, cache=tmp_path)
    assert second.tree.paths == first.tree.paths and second.table == first.table  # the same choice
    assert "cached at" in second.costs_source and "--retune" in second.costs_source
    # (a curve measured once on a busy machine may predict drafting to lose: that note aside)
    lines = [line for line in second.describe().splitlines() if not line.startswith("note: even the best tree")]
    assert len(lines) <= 3 and lines[0].startswith("auto tree:") and "cached at" in lines[1]
    assert f"predicted tau {second.predicted_tau:.2f} (at the head's calibrated acceptance" in lines[0]
    # other trees (a head tuned again: new acceptance) are not in the cache: they are measured
    with pytest.raises(AssertionError, match="measured again"):
        tune(gen, AcceptanceStats(tuple((0.2, 0.9) for _ in range(3)), steps=1), sizes=(1, 2, 4), reps=1, cache=tmp_path)


def test_cost_keys_carry_threads_dtype_target_and_head():
    gen, _ = _tuning_setup()
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cost_key(gen)
        torch.set_num_threads(2)
        two = cost_key(gen)
    finally:
        torch.set_num_threads(old)
    assert one["threads"] == 1 and two["threads"] == 2 and cost_file(one) != cost_file(two)
    gen32, _ = _tuning_setup(torch.float32)
    torch.set_num_threads(1)
    key32 = cost_key(gen32)
    assert key32["dtype"] == "float32" and one["dtype"] == "float64" and cost_file(key32) != cost_file(one)
    for field in ("cpu", "flags", "torch", "target", "head", "device"):
        assert field in one
    assert one["head"].startswith("eagle1-")
    gen_vocab = EagleGenerator(gen.target, gen.head, "eagle1", draft_vocab=torch.arange(32))
    assert cost_key(gen_vocab)["head"] != one["head"]  # a draft vocabulary changes a draft step's cost


def test_retune_measures_again_and_keeps_other_batch_sizes(tmp_path, monkeypatch):
    gen, stats = _tuning_setup()
    tune(gen, stats, sizes=(1, 2), reps=1, cache=tmp_path)
    [path] = tmp_path.glob("step-costs-*.json")
    data = json.loads(path.read_text())
    data["batch_sizes"]["4"] = {"verify": "whatever another measurement wrote"}
    path.write_text(json.dumps(data))
    calls = _count_measurements(monkeypatch)
    tune(gen, stats, sizes=(1, 2), reps=1, cache=tmp_path)
    assert calls == []
    again = tune(gen, stats, sizes=(1, 2), reps=1, cache=tmp_path, retune=True)
    assert calls == [1] and "measured now" in again.costs_source
    assert json.loads(path.read_text())["batch_sizes"]["4"] == data["batch_sizes"]["4"]


def test_use_auto_tree_caches_under_the_env_folder_and_retunes_on_request(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLESPEC_CACHE", str(tmp_path / "cache"))
    assert cache_dir() == tmp_path / "cache"
    gen, stats = _tuning_setup()
    gen.head_dir = tmp_path / "head"
    stats.save(gen.head_dir.mkdir() or gen.head_dir)
    calls = _count_measurements(monkeypatch)
    use_auto_tree(gen)
    assert calls == [1] and len(list((tmp_path / "cache").glob("step-costs-*.json"))) == 1
    chosen = gen.tree.paths
    use_auto_tree(gen)
    assert calls == [1] and gen.tree.paths == chosen and "cached at" in gen.tuned.describe()
    use_auto_tree(gen, retune=True)
    assert calls == [1, 1]
    monkeypatch.setenv("EAGLESPEC_RETUNE", "1")
    use_auto_tree(gen)
    assert calls == [1, 1, 1]


def test_cache_dir_follows_xdg_then_home(tmp_path, monkeypatch):
    monkeypatch.delenv("EAGLESPEC_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "eaglespec"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "eaglespec"


@pytest.mark.parametrize("damage", ["", "{not json", '{"key": 1}', "json-of-the-wrong-shape"])
def test_a_damaged_cost_cache_is_said_ignored_and_rewritten(tmp_path, monkeypatch, damage):
    gen, stats = _tuning_setup()
    path = cost_file(cost_key(gen), tmp_path)
    if damage == "json-of-the-wrong-shape":  # ours, but its numbers mangled
        tune(gen, stats, sizes=(1, 2), reps=1, cache=tmp_path)
        data = json.loads(path.read_text())
        data["batch_sizes"]["1"]["vanilla"] = "fast"
        damage = json.dumps(data)
    path.write_text(damage)
    tuned = tune(gen, stats, sizes=(1, 2), reps=1, cache=tmp_path)
    assert "ignored the damaged cost cache" in tuned.costs_source and "measured now" in tuned.costs_source
    assert json.loads(path.read_text())["batch_sizes"]["1"]["vanilla"] > 0  # rewritten
    _no_measuring(monkeypatch)
    assert "cached at" in tune(gen, stats, sizes=(1, 2), reps=1, cache=tmp_path).costs_source


def test_an_unwritable_cache_folder_only_costs_a_measurement(tmp_path):
    gen, stats = _tuning_setup()
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    tuned = tune(gen, stats, sizes=(1, 2), reps=1, cache=blocker / "cache")
    assert "not cached" in tuned.costs_source and "EAGLESPEC_CACHE" in tuned.costs_source


def test_batches_get_smaller_trees_down_to_none(tmp_path, monkeypatch):
    """A verify cost that grows with batch x tree size (as a saturated CPU's does) shrinks the
    tree as the batch grows, and a batch where no tree pays gets no drafts; the cache keeps one
    entry per batch size, and the generator's batches follow the choice."""
    gen, stats = _tuning_setup()

    def fake(gen, trees, context=256, reps=3, batch=1):
        vanilla = 1.0 * batch ** 0.5  # bigger batches: more tokens per forward for little more time
        return vanilla, {n: (0.1, vanilla * (1 + 0.3 * n * batch)) for n in trees}, 0.0

    monkeypatch.setattr(tuning, "measure_step_costs", fake)
    tuned = tune(gen, stats, sizes=(1, 2, 4), reps=1, cache=tmp_path, max_batch=16)
    sizes = {c.batch: (None if c.tree is None else c.tree.num_nodes - 1) for c in tuned.by_batch}
    assert tuned.tree.num_nodes - 1 >= sizes[2] >= (sizes.get(4) or 0)
    assert None in sizes.values() and 16 not in sizes  # once nothing pays, larger batches are not measured
    assert tuned.tree_for(1) is tuned.tree and tuned.tree_for(16) is None
    assert "by batch size" in tuned.describe()
    data = json.loads(next(tmp_path.glob("step-costs-*.json")).read_text())
    assert {"1", "2"} <= set(data["batch_sizes"])
    gen.tuned, gen.tree = tuned, tuned.tree
    batch = gen.new_batch()
    assert batch.choose(1).tree is tuned.tree and batch.choose(16) is None


def test_measured_costs_per_batch_size_run_the_batched_step():
    gen, _ = _tuning_setup()
    trees = {2: tuning.static_tree([(0,), (0, 0)])}
    vanilla, costs, noise = tuning.measure_step_costs(gen, trees, context=16, reps=1, batch=3)
    assert vanilla > 0 and costs[2][0] > 0 and costs[2][1] > 0



def test_costs_are_paired_with_an_adjacent_vanilla_step(monkeypatch):
    """A machine whose speed jumps between measurements (another tenant comes and goes) must not
    change the measured ratios: each cost is timed right after a vanilla step and kept as its ratio
    to it. A fake clock advances by each target step's nominal cost (1 ms a token, plus 10 ms) times
    a speed drawn afresh at every vanilla step and every draft; medians of separately timed costs
    (the old measurement) mix speeds and miss the nominal ratios."""
    import random
    import types

    gen, _ = _tuning_setup()
    clock, rng = [0.0], random.Random(1)
    speed = [1.0]
    real = gen.target.verify_rows

    def verify_rows(tokens, *args, **kwargs):
        n = tokens.shape[1]
        if n == 1:
            speed[0] = rng.choice((1.0, 1.7, 2.5))  # the machine changes between pairs, not inside one
        clock[0] += (0.010 + 0.001 * n) * speed[0]
        return real(tokens, *args, **kwargs)

    class Drafter(tuning.Drafter):  # drafting takes no time here, but the machine changes meanwhile too
        def draft_rows(self, *args, **kwargs):
            speed[0] = rng.choice((1.0, 1.7, 2.5))
            return super().draft_rows(*args, **kwargs)

    monkeypatch.setattr(gen.target, "verify_rows", verify_rows)
    monkeypatch.setattr(tuning, "Drafter", Drafter)
    monkeypatch.setattr(tuning, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    trees = {1: tuning.static_tree([(0,)]), 3: tuning.static_tree([(0,), (1,), (0, 0)])}
    vanilla, costs, _ = tuning.measure_step_costs(gen, trees, context=16, reps=7)
    for n, (draft, verify) in costs.items():
        assert draft == 0.0  # the fake clock does not move while drafting
        assert verify / vanilla == pytest.approx((0.010 + 0.001 * (n + 1)) / 0.011, rel=1e-9)

# ---- the adaptive tree ---------------------------------------------------------------------------
def _ladder():
    """A fake cost model: vanilla 10 ms; trees of 1, 3, 7 nodes cost 11, 12, 16 ms and were
    predicted at tau 1.6, 2.0, 2.3."""
    from eaglespec.core.tree import static_tree

    trees = [static_tree([(0,)]), static_tree([(0,), (1,), (0, 0)]), static_tree([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (2,)])]
    return [(None, 1.0, 0.010), (trees[0], 1.6, 0.011), (trees[1], 2.0, 0.012), (trees[2], 2.3, 0.016)]


def test_adaptive_tree_keeps_a_tree_that_pays_and_drops_one_that_does_not():
    from eaglespec.engine.tuning import AdaptiveTree

    policy = AdaptiveTree(_ladder(), 0.010, start=2, window=8, probe_every=20)
    for _ in range(8):
        policy.observe(2)  # tau 2.0 as predicted: 3 nodes stay best (2.0 / 12 ms beats 2.3 / 16 ms)
    assert policy.level == 2 and policy.history == [2]
    for _ in range(8):
        policy.observe(1)  # one bad window after a good one: judged on all 16 steps (tau 1.5), it stays
    assert policy.level == 2 and policy.history == [2]
    bad = 8
    while policy.tree is not None:
        policy.observe(1)  # nothing accepted on and on: every tree now costs more than it brings
        bad += 1
    # down, never up, within a few windows: the 1-node tree at the fourth (tau 1.25 over 32 steps),
    # then vanilla after its own first window
    assert bad == 32 and policy.history == [2, 1, 0]
    for _ in range(19):
        policy.observe(1)
    assert policy.level == 0
    policy.observe(1)  # after probe_every vanilla steps: try the smallest tree
    assert policy.level == 1
    for _ in range(8):
        policy.observe(3)  # better than calibrated: back to the 3-node tree
    assert policy.level == 2 and policy.history == [2, 1, 0, 1, 2]


def test_a_failed_probe_doubles_the_wait_for_the_next_and_a_kept_tree_resets_it():
    from eaglespec.engine.tuning import AdaptiveTree

    policy = AdaptiveTree(_ladder(), 0.010, start=2, window=8, probe_every=20, max_probe_every=50)
    for _ in range(8):
        policy.observe(1)  # the head does not pay here: vanilla
    waits = []
    for _ in range(3):  # three probes, each failing
        steps = 0
        while policy.level == 0:
            policy.observe(1)
            steps += 1
        waits.append(steps)
        assert policy.level == 1
        for _ in range(8):
            policy.observe(1)
        assert policy.level == 0
    assert waits == [20, 40, 50]  # doubled, then capped
    while policy.level == 0:
        policy.observe(1)
    for _ in range(8):
        policy.observe(3)  # this probe pays: a tree is kept and the wait is reset
    assert policy.level == 2 and policy.probe_wait == 20


def test_a_step_cut_by_the_confidence_floor_is_judged_at_what_it_cost():
    """Steps that verified less of the tree (a confidence floor) cost less: their tokens count at
    the whole tree's cost, so a tree earning its speed with fewer tokens a step is kept."""
    from eaglespec.engine.tuning import AdaptiveTree, TunedTree

    ladder = _ladder()
    tuned = TunedTree(ladder[2][0], 2.0, 1.67, [(1, 1.6, 0.001, 0.010, 1.45), (3, 2.0, 0.003, 0.009, 1.67),
                                                (7, 2.3, 0.006, 0.010, 1.44)], 0.010,
                      trees=((1, ladder[1][0]), (3, ladder[2][0]), (7, ladder[3][0])))
    # one level of the 3-node tree's 2 levels costs 1.5 ms; at 1.67x that is worth 0.25 of a token
    assert tuned.floor == pytest.approx(0.0015 / 0.010 * 1.67)
    policy = AdaptiveTree.from_tuned(tuned)
    assert policy.step_cost(4) is None  # the whole tree: the ladder's own cost
    assert policy.step_cost(2) == 0.011  # two tokens verified: the ladder's 1-node tree
    assert policy.step_cost(3) == 0.012  # three: no 2-node tree on the ladder, so the next width up
    assert policy.step_cost(1) == pytest.approx(0.010 + 0.0015)  # the root alone: a vanilla step and one level
    plain = AdaptiveTree.from_tuned(tuned)
    # six steps verify the root alone (1 token, 11.5 ms) and two verify two tokens (2 tokens, 11 ms):
    # 10 tokens in 91 ms, faster than vanilla (8 in 80 ms) and than the ladder's 1-node tree
    for i in range(8):
        verified = 2 if i in (0, 5) else 1
        policy.observe(verified, policy.step_cost(verified))
        plain.observe(verified)
    assert plain.level == 1  # tau 1.25 counted at the whole tree's 12 ms: it moves down
    assert policy.level == 2  # at what its steps cost, the tree earns its keep


def _wrong_generator():
    """A tiny target's generator whose tuned tree (the fake ladder's 3 nodes) never gets a draft
    accepted: the oracle's chain, every token shifted off the target's. -> (gen, vanilla output of
    [5, 6, 7] for 60 tokens)."""
    from conftest import tiny_target
    from oracle import OracleDrafter

    from eaglespec.engine.decoding import EagleGenerator
    from eaglespec.engine.tuning import AdaptiveTree, TunedTree

    target = tiny_target("llama")
    ladder = _ladder()
    tuned = TunedTree(ladder[2][0], 2.0, 1.67, [(1, 1.6, 0.001, 0.010, 1.45), (3, 2.0, 0.002, 0.010, 1.67),
                                                (7, 2.3, 0.004, 0.012, 1.44)], 0.010,
                      trees=((1, ladder[1][0]), (3, ladder[2][0]), (7, ladder[3][0])))
    assert AdaptiveTree.from_tuned(tuned).level == 2
    gen = EagleGenerator(target, None, "none")
    vanilla = gen.generate(input_ids=[5, 6, 7], max_new_tokens=60, speculative=False, stop_token_ids=set()).token_ids

    class WrongDrafter(OracleDrafter):
        def draft_one(self, *args):
            tree = super().draft_one(*args)
            tokens = tree.tokens.clone()
            tokens[1:] = (tokens[1:] + 1) % target.vocab_size
            return type(tree)(tokens, tree.buffers)

    gen.drafter, gen.tuned, gen.tree = WrongDrafter(target, [5, 6, 7], [-1, 0, 1, 2]), tuned, tuned.tree
    return gen, vanilla


def test_adaptive_tree_in_the_loop_moves_to_vanilla_when_drafts_are_always_wrong():
    """A generator whose tuned tree never gets a draft accepted decodes vanilla after one window,
    and its output stays that of vanilla decoding."""
    gen, vanilla = _wrong_generator()
    out = gen.generate(input_ids=[5, 6, 7], max_new_tokens=60, stop_token_ids=set()).token_ids
    assert out == vanilla
    assert gen.last_policy.history[:2] == [2, 0]


def test_a_noisy_cost_curve_is_measured_again_then_flagged(tmp_path, monkeypatch):
    gen, stats = _tuning_setup()
    noises = iter([0.9, 0.1])
    calls = []

    def fake(gen, trees, context=256, reps=3, batch=1):
        calls.append(1)
        noise = next(noises, 0.8)
        return 1.0 + noise, {n: (0.1, 1.0) for n in trees}, noise

    monkeypatch.setattr(tuning, "measure_step_costs", fake)
    curve = tuning.step_costs(gen, {1: tuning.static_tree([(0,)])}, cache=tmp_path)
    assert len(calls) == 2 and curve.vanilla == 1.1 and "curve is noisy" not in curve.source  # the quiet second one
    calls.clear()
    noisy = tuning.step_costs(gen, {1: tuning.static_tree([(0,)])}, cache=tmp_path, retune=True)
    assert len(calls) == tuning.NOISE_TRIES and "curve is noisy" in noisy.source and "--retune" in noisy.source
    data = json.loads(next(tmp_path.glob("step-costs-*.json")).read_text())
    assert data["batch_sizes"]["1"]["noise"] == 0.8
    assert "curve is noisy" in tuning.step_costs(gen, {1: tuning.static_tree([(0,)])}, cache=tmp_path).source  # said on reading too


def test_a_cost_curve_measured_beside_other_work_is_measured_again_then_flagged(tmp_path, monkeypatch):
    """A job running through the measurement slows every timing alike (the spread stays small):
    the CPU time other processes ran meanwhile says so; such a curve is measured again, and kept
    flagged when every try was shared."""
    gen, stats = _tuning_setup()
    calls = []
    clock = iter(range(10**6))  # a second between readings: a try lasts 1 s
    monkeypatch.setattr(tuning, "time", SimpleNamespace(perf_counter=lambda: float(next(clock))))
    monkeypatch.setattr(os, "cpu_count", torch.get_num_threads)  # no idle cores to leave aside
    loads = iter([1.5, 0.05])  # cores of other work in each try; then 1.5 for ever
    readings_taken, busy = [0], [100.0]

    def readings():  # (the machine's CPU seconds, ours), before and after each try
        readings_taken[0] += 1
        if readings_taken[0] % 2 == 0:  # after: the try's other work ran meanwhile
            busy[0] += next(loads, 1.5)
        return busy[0], 7.0

    def fake(gen, trees, context=256, reps=3, batch=1):
        calls.append(1)
        return 1.0 + 0.1 * len(calls), {n: (0.1, 1.0) for n in trees}, 0.01  # never noisy by the spread

    monkeypatch.setattr(tuning, "_cpu_seconds", readings)
    monkeypatch.setattr(tuning, "measure_step_costs", fake)
    curve = tuning.step_costs(gen, {1: tuning.static_tree([(0,)])}, cache=tmp_path)
    assert len(calls) == 2 and curve.vanilla == 1.2 and "other processes" not in curve.source  # the quiet second one
    calls.clear()
    shared = tuning.step_costs(gen, {1: tuning.static_tree([(0,)])}, cache=tmp_path, retune=True)
    assert len(calls) == tuning.NOISE_TRIES and "other processes ran 1.5 cores" in shared.source
    assert "--retune" in shared.source and "noisy" not in shared.source
    data = json.loads(next(tmp_path.glob("step-costs-*.json")).read_text())
    assert data["batch_sizes"]["1"]["others"] == pytest.approx(1.5)
    assert "other processes ran 1.5" in tuning.step_costs(gen, {1: tuning.static_tree([(0,)])}, cache=tmp_path).source


def test_the_quietest_try_is_the_one_least_over_its_limits():
    slightly_shared = (1.0, {}, 0.05, 0.26)
    very_noisy = (1.0, {}, 0.9, 0.0)
    assert tuning._overshoot(slightly_shared) < tuning._overshoot(very_noisy)
    assert tuning._overshoot((1.0, {}, tuning.NOISE_LIMIT, tuning.OTHERS_LIMIT)) == 1.0  # at the limits: quiet


def test_other_processes_cpu_time_is_the_machines_less_this_processs_and_the_idle_cores():
    assert tuning._others((10.0, 4.0), (13.0, 5.0), 2.0) == 1.0  # 3 s ran, 1 s of it ours, over 2 s
    assert tuning._others((10.0, 4.0), (13.0, 5.0), 2.0, spare=1) == 0.0  # a core our threads leave idle held it
    assert tuning._others((10.0, 4.0), (10.5, 5.0), 1.0) == 0.0  # ticks round: never below zero
    assert tuning._others(None, (1.0, 1.0), 1.0) == 0.0  # not known: not counted
    # /proc/stat's cpu line: user nice system idle iowait irq softirq steal guest guest_nice, in ticks
    assert tuning._busy_seconds("cpu  100 20 30 5000 400 6 7 8 50 9", 100) == (100 + 20 + 30 + 6 + 7 + 8) / 100
    with pytest.raises(ValueError):
        tuning._busy_seconds("intr 1 2 3 4 5 6 7 8 9", 100)
    before = real_cpu_seconds()
    if before is None:
        pytest.skip("no /proc/stat here")
    end = time.process_time() + 0.3
    while time.process_time() < end:  # this process's own work
        pass
    after = real_cpu_seconds()
    assert after[1] - before[1] >= 0.25 and after[0] - before[0] >= after[1] - before[1] - 0.05


def test_best_trees_take_the_most_valuable_nodes_when_a_noisy_calibration_misorders_ranks():
    # a calibration that saw no hit at rank 1 but some at rank 2 (few trials): the rank-2 node is
    # worth 0.3, the rank-1 node nothing
    stats = AcceptanceStats(((0.6, 0.0, 0.3), (0.4, 0.2, 0.0)), steps=1)
    trees = best_trees(stats, 3)
    assert set(trees[1][0]) == {(0,), (2,)} and trees[1][1] == pytest.approx(1.9)
    assert set(trees[2][0]) == {(0,), (2,), (0, 0)} and trees[2][1] == pytest.approx(2.14)


def test_reset_starts_a_policy_afresh():
    from eaglespec.engine.tuning import AdaptiveTree

    policy = AdaptiveTree(_ladder(), 0.010, start=2, window=8, probe_every=20, max_probe_every=50)
    for _ in range(8):
        policy.observe(1)  # vanilla after one window
    while policy.level == 0:
        policy.observe(1)
    for _ in range(8):
        policy.observe(1)  # a failed probe: the next waits twice as long
    assert policy.level == 0 and policy.probe_wait == 40
    policy.reset()
    assert policy.level == 2 and policy.history[-1] == 2 and policy.probe_wait == 20
    assert policy.steps == policy.emitted == 0 and not policy.probing


def test_a_batch_that_outlives_its_sequences_starts_each_lone_one_at_the_tuned_tree():
    """The server decodes every request through one batch: a request after one where the head did
    not pay starts at the tuned tree again, not at the vanilla (and the probe wait) the last left."""
    from eaglespec.core.config import SamplingParams

    gen, _ = _wrong_generator()
    batch = gen.new_batch()
    policy = gen.last_policy
    seen = []
    for _ in range(2):
        seq, _ = batch.add([5, 6, 7], 30, SamplingParams(), set())
        seen.append(len(policy.history))
        while not seq.done:
            batch.step()
    first, second = policy.history[:seen[1]], policy.history[seen[1]:]
    assert first[:2] == [2, 0]  # the head never pays: vanilla after one window
    assert second[:2] == [2, 0]  # the next request: the tuned tree again, then vanilla after its own window


def test_an_adaptive_tree_from_an_incomplete_table_is_refused_in_one_line():
    from eaglespec.engine.tuning import AdaptiveTree, TunedTree

    ladder = _ladder()
    tuned = TunedTree(ladder[2][0], 2.0, 1.67, [(1, 1.6, 0.001, 0.010, 1.45), (3, 2.0, 0.003, 0.009, 1.67)], 0.010)
    with pytest.raises(EagleError, match="tuned tree of every size"):
        AdaptiveTree.from_tuned(tuned)  # no trees: before, StopIteration from inside
    with pytest.raises(ValueError, match="window 0"):
        AdaptiveTree(ladder, 0.010, start=2, window=0)


def test_a_step_whose_drafting_stopped_early_is_judged_at_the_levels_it_drafted():
    """A grown tree verifies its N best of the levels drafted: a step that drafted fewer levels
    costs the ladder tree of its width less the levels it did not draft (not the whole tree)."""
    from eaglespec.engine.tuning import AdaptiveTree

    ladder = _ladder()  # 1, 3 (depth 2), 7 (depth 3) nodes at 11, 12, 16 ms; vanilla 10 ms
    policy = AdaptiveTree(ladder, 0.010, 3, level_cost=0.002)
    assert policy.step_cost(8, 3) is None  # the whole tree
    assert policy.step_cost(8, 2) == pytest.approx(0.014)  # every node verified, one level fewer
    assert policy.step_cost(3, 1) == pytest.approx(0.012 - 0.002)  # 3 tokens after one level: the 3-node tree less a level
    assert policy.step_cost(2, 1) == pytest.approx(0.011)  # the 1-node tree drafts one level: nothing saved
    assert policy.step_cost(1, 2) == pytest.approx(0.010 + 2 * 0.002)  # the root alone after two levels
    assert policy.step_cost(3) == 0.012  # levels unknown: read from the width (a static tree cut by the floor)
    assert policy.step_cost(1) == pytest.approx(0.012)  # the root alone, one level unknown-ly drafted


def test_rerank_top_k_is_two_for_cpu_trees_then_about_the_square_root():
    assert [tuning.rerank_top_k(n, 3) for n in (1, 3, 7, 8)] == [2, 2, 2, 2]
    assert [tuning.rerank_top_k(n, 6) for n in (9, 16, 24, 60)] == [3, 4, 4, 7]
    # raised until k a level can hold the tree: a shallow, wide tree
    assert tuning.rerank_top_k(3, 1) == 3 and tuning.rerank_top_k(7, 2) == 3 and tuning.rerank_top_k(12, 1) == 12


def test_a_lone_sequence_grows_the_tuned_trees_eagle2_style(tmp_path, monkeypatch):
    """--tree auto's trees of N nodes and depth D are drafted for a lone sequence as dynamic:k,D,N
    (each step's nodes follow the draft's confidence, not the static shape; every output is
    vanilla's); `rerank = False` (bench's auto-static) drafts the static shapes, as does a batch of
    two; the tuning line says which."""
    monkeypatch.setenv("EAGLESPEC_CACHE", str(tmp_path / "cache"))
    target = tiny_target("llama", dtype=torch.float64)
    torch.manual_seed(0)
    gen = EagleGenerator(target, EagleHead(target.config).to(target.dtype), "eagle1", head_dir=tmp_path)
    AcceptanceStats(((0.9, 0.6, 0.3), (0.8, 0.3, 0.2), (0.7, 0.2, 0.1)), steps=1).save(tmp_path)
    # a cost curve where a bigger tree costs little more (a real one, timed on a busy machine, may
    # price the bigger trees out, and this test is about how the chosen tree is drafted)
    monkeypatch.setattr(tuning, "measure_step_costs",
                        lambda gen, trees, context=256, reps=3, batch=1: (1.0, {n: (0.01, 1.0 + 0.001 * n) for n in trees}, 0.0))
    use_auto_tree(gen)
    tree = gen.tree
    n, static_parents = tree.num_nodes - 1, tree.buffers.parents.tolist()
    k = tuning.rerank_top_k(n, tree.depth)
    assert n >= 3 and gen.rerank_for(tree) == k and gen._drafter(tree).rerank == k
    assert f"dynamic:{k},{tree.depth},{n}" in gen.tuned.describe() and "EAGLE-2" in gen.tuned.describe()
    assert "not verified" in gen.tuned.describe(rerank=0)
    gen.adaptive, gen.draft_floor = False, 0.0  # the tuned tree on every step, whole
    vanilla = gen.generate(input_ids=PROMPT, max_new_tokens=40, speculative=False, stop_token_ids=set()).token_ids

    def shapes():
        seen = []
        out = [t for step in gen.stream(PROMPT, 40, stop_token_ids=set(),
                                        observe=lambda t, logits, acc: seen.append(t.buffers.parents.tolist()))
               for t in step.tokens]
        assert out == vanilla
        return seen[:-1]  # the last step may verify its root alone

    grown = shapes()
    assert all(len(p) == n + 1 for p in grown) and any(p != static_parents for p in grown)
    gen.rerank = False
    assert gen.rerank_for(tree) == 0
    assert all(p == static_parents for p in shapes())
    gen.rerank = True
    together, grown = [], []
    grow = Drafter._grow_dynamic
    monkeypatch.setattr(Drafter, "_grow_dynamic", lambda self, *a: grown.append(1) or grow(self, *a))
    batch = gen.generate_batch(input_ids=[PROMPT, PROMPT[:6]], max_new_tokens=8, stop_token_ids=set())
    assert batch[0].token_ids == vanilla[:8] and grown == []  # two sequences: the static shape
    drafter = gen._drafter(tree)
    state = drafter.new_state(2)
    feats = torch.zeros(3, target.hidden_size, dtype=target.dtype)
    for t in drafter.draft_rows(state, [torch.tensor([1, 2, 3])] * 2, [feats] * 2, [3, 3]):
        together.append(t.buffers.parents.tolist())
    assert together == [static_parents] * 2
