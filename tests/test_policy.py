"""bench/policy.py: traces of the chain at every position, and the adaptive policy replayed on them."""

import json

import pytest
import torch
from conftest import tiny_target

from eaglespec.bench import policy as pol
from eaglespec.core.tree import static_tree
from eaglespec.draft.head import EagleHead
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.engine.tuning import AdaptiveTree

PROMPT = [5, 17, 33, 9, 64, 21, 7, 90, 11, 3]


def _chain_ladder():
    """vanilla 10 ms; the 1- and 3-node chains at 11 and 12 ms, predicted at tau 1.6 and 2.0."""
    return [(None, 1.0, 0.010), (pol.chain_of(1), 1.6, 0.011), (pol.chain_of(3), 2.0, 0.012)]


def _record(accepted: int, conf: float, tokens: int = 41) -> dict:
    return {"name": "t", "category": "c", "tokens": tokens, "steps": [[accepted, [conf] * 3]] * (tokens - 1)}


def test_replay_of_a_chain_accepted_whole_everywhere():
    # 40 tokens after the prefill's, 4 a step: 10 steps of the 3-node chain (12 ms) against 40 vanilla ones (10 ms)
    speedup, tau = pol.replay(_record(3, -0.1), AdaptiveTree(_chain_ladder(), 0.010, start=2), floor=0.15)
    assert tau == pytest.approx(4.0) and speedup == pytest.approx(0.400 / 0.120)


def test_replay_of_a_useless_head_stays_near_vanilla_and_a_later_probe_costs_less():
    sure_and_wrong = _record(0, -0.1, tokens=257)
    soon, late = (pol.replay(sure_and_wrong, AdaptiveTree(_chain_ladder(), 0.010, start=2, probe_every=probe), 0.15)[0]
                  for probe in (16, 64))
    fixed = pol.replay(sure_and_wrong, AdaptiveTree(_chain_ladder(), 0.010, start=2, window=10**6), 0.15)[0]
    assert fixed == pytest.approx(0.010 / 0.012)  # never leaves the tree: every step costs 12 ms for one token
    assert 0.95 < soon < late < 1.0


def test_a_text_of_one_token_replays_as_vanilla():
    assert pol.replay(_record(0, -0.1, tokens=1), AdaptiveTree(_chain_ladder(), 0.010, start=2), 0.15) == (1.0, 1.0)


def test_replay_judges_a_step_cut_by_the_floor_at_what_it_cost():
    # every draft below the floor: each step verifies the root alone, at a vanilla step and one level
    unsure = _record(3, -5.0)
    policy = AdaptiveTree(_chain_ladder(), 0.010, start=2, window=10**6, level_cost=0.001)
    speedup, tau = pol.replay(unsure, policy, floor=0.15)
    assert tau == 1.0 and speedup == pytest.approx(0.010 / 0.011)
    assert pol.replay(unsure, AdaptiveTree(_chain_ladder(), 0.010, start=2, window=10**6), floor=0.0)[1] == 4.0


def test_a_ladder_whose_best_rung_may_be_a_wider_tree_is_not_replayed():
    wide = static_tree([(0,), (1,), (0, 0)])
    ladder = [(None, 1.0, 0.010), (pol.chain_of(1), 1.6, 0.011), (wide, 3.0, 0.012)]
    with pytest.raises(ValueError, match="not a chain"):
        pol.chain_ladder(AdaptiveTree(ladder, 0.010, start=2))
    cut = pol.chain_ladder(AdaptiveTree(_chain_ladder() + [(static_tree([(0,), (1,), (0, 0), (2,)]), 2.05, 0.030)],
                                        0.010, start=2))
    assert len(cut.ladder) == 3 and cut.level == 2


def test_the_traced_chains_are_the_ones_decoding_drafts():
    """At every root decoding drafts from, the trace's chain is the decoder's own tree (the head
    fed the target's states of the whole text at once, decoding's step by step)."""
    target = tiny_target("llama")
    torch.manual_seed(1)
    gen = EagleGenerator(target, EagleHead(target.config).to(target.dtype), pol.chain_of(3))
    drafted = []
    outputs = list(gen.stream(PROMPT, 40, stop_token_ids=set(), observe=lambda tree, logits, acc: drafted.append(tree.tokens[1:].tolist())))
    text = [t for out in outputs for t in out.tokens]
    traced = list(pol.chains(gen, PROMPT, text, 3))
    assert len(traced) == len(text) - 1 and all(len(conf) == 3 and conf[0] >= conf[1] >= conf[2] for _, conf in traced)
    produced = 1  # the prefill's token
    compared = 0
    for out, tokens in zip(outputs[1:], drafted):
        if tokens:  # the last step verifies its root alone
            assert traced[produced - 1][0] == tokens
            compared += 1
        produced += len(out.tokens)
    assert compared >= 10
    steps = pol.trace_text(gen, PROMPT, text, 3)
    assert [s[0] for s in steps[:1]] == [outputs[1].stats.accepted]


def test_trace_writes_a_line_a_prompt_and_a_rerun_continues(tmp_path):
    target = tiny_target("llama")
    torch.manual_seed(1)
    gen = EagleGenerator(target, EagleHead(target.config).to(target.dtype), pol.chain_of(2))
    out, said = tmp_path / "t.jsonl", []
    pol.trace(gen, [("a", "x", PROMPT)], 12, out, 2, say=said.append)
    pol.trace(gen, [("a", "x", PROMPT), ("b", "y", PROMPT[:5])], 12, out, 2, say=said.append)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["name"] for r in records] == ["a", "b"] and len(said) == 2
    assert all(len(r["steps"]) == r["tokens"] - 1 for r in records)
    rows = pol.table(records, {"p": (lambda: AdaptiveTree(_chain_ladder(), 0.010, start=2), 0.0)})
    assert rows[0] == "| policy | all | x | y |" and rows[2].startswith("| p | ")


def test_replay_of_a_missing_or_bad_file_or_option_is_one_line(tmp_path, capsys, monkeypatch):
    from eaglespec.cli import options

    gen = EagleGenerator(tiny_target("llama"), None, "none")
    gen.tuned = object()  # only its presence is read before the options and files
    monkeypatch.setattr(options, "load_generator", lambda args: gen)
    assert pol.main(["replay", str(tmp_path / "none.jsonl")]) == 2
    assert "none.jsonl" in capsys.readouterr().out
    (tmp_path / "t.jsonl").write_text(json.dumps(_record(1, -0.1)) + "\n")
    assert pol.main(["replay", str(tmp_path / "t.jsonl"), "--probe", "x", "--floor", "0.1"]) == 2
    assert "comma-separated numbers" in capsys.readouterr().out
