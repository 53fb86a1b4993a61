"""`eaglespec bench`: metrics on hand-made records, dataset loaders, method parsing, and the harness
end to end on a tiny model (outputs well formed; a non-lossless method caught)."""

import argparse
import json

import pytest
import torch
from bench_helpers import AlteredMethod, CountingMethod, tiny_generator, words

from eaglespec.bench import datasets
from eaglespec.bench.cli import EXIT_NOT_LOSSLESS, execute, register, run_metadata
from eaglespec.bench.datasets import Question, load_jsonl, load_questions, user_message
from eaglespec.bench.harness import Journal, first_difference, run_bench
from eaglespec.bench.methods import BASELINE, HF_GENERATE, HF_PROMPT_LOOKUP, build_methods, parse_depths
from eaglespec.bench.metrics import Record, acceptance_histogram, n_alpha, paired_speedup, speedup, summarize, tau
from eaglespec.bench.report import PLOTS
from eaglespec.core.config import SamplingParams
from eaglespec.errors import EagleError

# -- metrics -----------------------------------------------------------------------------------


def test_tau_is_mean_emitted_over_steps():
    assert tau([1, 2, 3, 2]) == 2.0
    assert tau([4]) == 4.0
    assert tau([]) is None


def test_acceptance_histogram_counts_each_length():
    assert acceptance_histogram([0, 1, 1, 3]) == [1, 2, 0, 1]
    assert acceptance_histogram([0, 0]) == [2]
    assert acceptance_histogram([]) == []


def test_n_alpha_is_conditional_acceptance_by_depth():
    # depth 1: 3 of 4 steps accepted >= 1; depth 2: 1 of those 3 went on; depth 3: that 1 went on; depth 4: it stopped
    assert n_alpha([0, 1, 1, 3], 4) == [0.75, 1 / 3, 1.0, 0.0]
    assert n_alpha([0, 0], 3) == [0.0, None, None]
    assert n_alpha([2, 2, 2, 2], 2) == [1.0, 1.0]


def test_speedup_is_ratio_of_time_for_the_same_tokens():
    assert speedup(100, 2.0, 100, 5.0) == 2.5
    assert speedup(50, 1.0, 100, 4.0) == 2.0  # throughput ratio when token counts differ (sampling)
    assert speedup(10, 1.0, 0, 0.0) is None



def test_paired_speedup_is_the_median_of_round_ratios():
    """The machine ran twice as fast in the second round: each round's own ratio is 1.2x, which a
    ratio of the medians of the two columns (60/75 = 0.8x here) would not say."""
    paired = paired_speedup([(60.0, 50.0), (120.0, 100.0), (48.0, 40.0)])
    assert paired.speedup == pytest.approx(1.2) and paired.low == pytest.approx(1.2) == paired.high
    assert (paired.tokens_per_second, paired.vanilla_tokens_per_second) == (60.0, 50.0)
    mixed = paired_speedup([(50.0, 50.0), (30.0, 10.0), (55.0, 50.0)])
    assert mixed.speedup == pytest.approx(1.1) and (mixed.low, mixed.high) == (1.0, 3.0)  # one stray round is outvoted
    with pytest.raises(ValueError):
        paired_speedup([])

def test_summarize_hand_made_records():
    runs = [
        ("vanilla", "math", Record([1] * 10, 4.0, [0] * 9, [1] * 9)),
        ("vanilla", "code", Record([1] * 6, 2.0, [0] * 5, [1] * 5)),
        ("chain:3", "math", Record([1] * 10, 1.0, [3, 2, 0, 1], [4, 3, 1, 1])),
        ("chain:3", "code", Record([1] * 6, 2.0, [1, 3], [2, 3])),
        (HF_GENERATE, "math", Record([1] * 10, 8.0)),
        (HF_GENERATE, "code", Record([1] * 6, 8.0)),
    ]
    s = summarize(runs, "vanilla", {"chain:3": 3})
    assert list(s) == ["vanilla", "chain:3", HF_GENERATE]
    c = s["chain:3"]
    assert (c["tokens"], c["seconds"], c["tokens_per_s"]) == (16, 3.0, 16 / 3)
    assert c["speedup"] == 2.0                      # 6 s of vanilla / 3 s
    assert c["speedup_by_category"] == {"math": 4.0, "code": 1.0}
    assert c["tau"] == 14 / 6 and c["steps"] == 6
    assert c["histogram"] == [1, 2, 1, 2]
    assert c["n_alpha"] == [5 / 6, 3 / 5, 2 / 3]
    v = s["vanilla"]
    assert (v["speedup"], v["tau"], v["histogram"], v["n_alpha"]) == (1.0, 1.0, [14], None)
    h = s[HF_GENERATE]
    assert h["speedup"] == 6 / 16 and h["tau"] is None and h["histogram"] is None and h["n_alpha"] is None


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2, 3], [1, 2]) == 2

# -- datasets ----------------------------------------------------------------------------------


def test_mt_bench_has_80_questions_with_two_turns():
    qs = load_questions("mt-bench")
    assert len(qs) == 80
    assert all(len(q.turns) == 2 for q in qs)
    assert qs[0].question_id == "81" and qs[0].category == "writing"
    assert len({q.category for q in qs}) == 8
    assert [q.question_id for q in load_questions("mt-bench", limit=3)] == ["81", "82", "83"]


def test_humaneval_has_164_code_prompts():
    qs = load_questions("humaneval")
    assert len(qs) == 164
    assert qs[0].question_id == "HumanEval/0" and qs[0].turns[0].lstrip().startswith("from typing import List")
    assert user_message(qs[0], 0, "humaneval", chat_template=True).startswith(datasets.HUMANEVAL_INSTRUCTION)
    assert user_message(qs[0], 0, "humaneval", chat_template=False) == qs[0].turns[0]


def test_user_jsonl(tmp_path):
    path = tmp_path / "question.jsonl"
    path.write_text('{"question_id": 1, "category": "a", "turns": ["hi", "again"]}\n\n'
                    '{"question_id": "x", "turns": ["only"]}\n')
    assert load_jsonl(path) == [Question("1", "a", ("hi", "again")), Question("x", "uncategorised", ("only",))]
    assert len(load_questions(str(path), limit=1)) == 1


@pytest.mark.parametrize("bad, message", [
    ('{"question_id": 2, "turns": ["ok"', "line 2: not valid JSON"),
    ('{"question_id": 2, "category": "a"}', "line 2: missing turns"),
    ('{"question_id": 2, "turns": []}', "line 2: 'turns' must be a non-empty list"),
    ('[1, 2]', "line 2: expected a JSON object"),
])
def test_malformed_jsonl_names_file_and_line(tmp_path, bad, message):
    path = tmp_path / "q.jsonl"
    path.write_text('{"question_id": 1, "turns": ["fine"]}\n' + bad + "\n")
    with pytest.raises(EagleError, match=message) as err:
        load_jsonl(path)
    assert str(path) in str(err.value)


def test_missing_question_file_and_bad_limit(tmp_path):
    with pytest.raises(EagleError, match="not found"):
        load_questions(str(tmp_path / "nope.jsonl"))
    with pytest.raises(EagleError, match="--limit"):
        load_questions("mt-bench", limit=0)

# -- methods -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gen():
    return tiny_generator()


def test_build_methods_parses_names(gen):
    methods, notes = build_methods(gen, "eagle1,chain,dynamic:2,2,4,hf,pld", [2, 3], greedy=True)
    assert [m.name for m in methods] == [BASELINE, "eagle1", "chain:2", "chain:3", "dynamic:2,2,4", HF_GENERATE, HF_PROMPT_LOOKUP]
    assert [m.kind for m in methods] == ["baseline"] + ["lossless"] * 4 + ["reference"] * 2
    assert [m.depth for m in methods[:5]] == [0, 5, 2, 3, 2]  # EAGLE-1's tree is 5 levels deep
    assert "vanilla added" in notes[0]
    methods, notes = build_methods(gen, "vanilla,dynamic,hf,pld", [3], greedy=False)
    assert [m.name for m in methods] == [BASELINE, "dynamic:4,4,12"]
    assert len(notes) == 2 and all("greedy only" in n for n in notes)
    with pytest.raises(EagleError, match="unknown method 'medusa'; comma-separated: vanilla"):
        build_methods(gen, "vanilla,medusa", [3], greedy=True)
    with pytest.raises(EagleError, match="dynamic:4,4,12"):  # a tree's arguments: the tree's own message
        build_methods(gen, "vanilla,dynamic:4,4", [3], greedy=True)
    with pytest.raises(EagleError, match="--chain"):
        parse_depths("3,x")


def test_auto_fixed_keeps_the_tuned_tree_that_auto_leaves():
    """A random head's drafts are rejected: `auto` (adaptive) drops to vanilla steps after a window,
    `auto-fixed` verifies the tuned tree at every step; both emit vanilla's tokens, and the
    generator's own adaptive setting is left as it was."""
    from eaglespec.bench.methods import AUTO_FIXED
    from eaglespec.core.tree import static_tree
    from eaglespec.engine.tuning import TunedTree

    gen = tiny_generator()
    with pytest.raises(EagleError, match="--tree auto"):
        build_methods(gen, f"vanilla,{AUTO_FIXED}", [], greedy=True)
    small, big = static_tree([(0,)]), static_tree([(0,), (1,), (0, 0)])
    gen.tuned = TunedTree(big, 2.0, 1.5, [(1, 1.6, 0.001, 0.010, 1.45), (3, 2.0, 0.002, 0.010, 1.67)], 0.010,
                          trees=((1, small), (3, big)))
    gen.tree = big
    gen.draft_floor = 0.0  # whole trees (the confidence floor: the test below)
    methods, _ = build_methods(gen, f"vanilla,auto,{AUTO_FIXED}", [], greedy=True)
    assert [m.name for m in methods] == [BASELINE, "auto", AUTO_FIXED] and methods[2].spec.startswith(f"{AUTO_FIXED}: ")
    ids = gen.encode("hello there")
    gen.eos_token_ids = set  # no stop token: every run makes its 30 tokens
    records = {m.name: m.run(ids, 30, SamplingParams()) for m in methods}
    assert records["auto"].token_ids == records[AUTO_FIXED].token_ids == records[BASELINE].token_ids
    assert set(records[AUTO_FIXED].tree_sizes[:-1]) == {big.num_nodes}  # the last token's step needs no tree
    assert 1 in records["auto"].tree_sizes[:-1]  # the adaptive policy left the tree for vanilla steps
    assert gen.adaptive is True


def test_auto_whole_drafts_the_whole_tree_that_the_floor_cuts():
    """The tuned floor (a level's drafting cost at the predicted speed: 0.15 here) stops a random
    head's drafting after the first level: grown EAGLE-2 style (`auto`'s way for a lone sequence)
    its 2 best first-level nodes are verified, in the static shape (`auto-static`) every node is
    below the floor and the root is verified alone. `auto-whole` is auto with the floor off: whole
    trees until the adaptive policy leaves them. All emit vanilla's tokens; the generator's
    settings are left as they were."""
    from eaglespec.bench.methods import AUTO_FIXED, AUTO_FLOOR, AUTO_STATIC, AUTO_WHOLE
    from eaglespec.core.tree import static_tree
    from eaglespec.engine.tuning import TunedTree

    gen = tiny_generator()
    small, big = static_tree([(0,)]), static_tree([(0,), (1,), (0, 0)])
    gen.tuned = TunedTree(big, 2.0, 1.5, [(1, 1.6, 0.001, 0.010, 1.45), (3, 2.0, 0.002, 0.010, 1.67)], 0.010,
                          trees=((1, small), (3, big)))
    gen.tree = big
    assert gen.floor_for(big) == pytest.approx(0.15)
    methods, _ = build_methods(gen, f"vanilla,{AUTO_FIXED},{AUTO_WHOLE},{AUTO_STATIC}", [], greedy=True)
    assert methods[2].spec.startswith(f"{AUTO_WHOLE}: ") and "top-2" in methods[2].spec
    assert methods[3].spec.startswith(f"{AUTO_STATIC}: ") and "top-" not in methods[3].spec
    ids = gen.encode("hello there")
    gen.eos_token_ids = set
    records = {m.name: m.run(ids, 30, SamplingParams()) for m in methods}
    assert records[AUTO_FIXED].token_ids == records[AUTO_WHOLE].token_ids == records[BASELINE].token_ids
    assert records[AUTO_STATIC].token_ids == records[BASELINE].token_ids
    assert set(records[AUTO_FIXED].tree_sizes[:-1]) == {3}  # the first level's 2 best nodes
    assert set(records[AUTO_STATIC].tree_sizes) == {1}  # every node below the floor
    assert records[AUTO_WHOLE].tree_sizes[0] == big.num_nodes
    assert gen.draft_floor is None and gen.rerank is True
    # auto-floor:P sets the floor: 0 is auto-whole, a high one drafts the first level alone
    methods, _ = build_methods(gen, f"vanilla,{AUTO_FLOOR}:0,{AUTO_FLOOR}:0.9", [], greedy=True)
    assert [m.name for m in methods] == [BASELINE, f"{AUTO_FLOOR}:0", f"{AUTO_FLOOR}:0.9"]
    assert ", floor" not in methods[1].spec and ", floor 0.9," in methods[2].spec
    floored = {m.name: m.run(ids, 30, SamplingParams()) for m in methods[1:]}
    assert floored[f"{AUTO_FLOOR}:0"].tree_sizes == records[AUTO_WHOLE].tree_sizes
    assert max(floored[f"{AUTO_FLOOR}:0.9"].tree_sizes) == 3  # the first level's 2 best at most (adaptive: fewer)
    assert all(r.token_ids == records[BASELINE].token_ids for r in floored.values()) and gen.draft_floor is None
    for bad in ("2", "x"):
        with pytest.raises(EagleError, match=rf"method '{AUTO_FLOOR}:{bad}': {AUTO_FLOOR}:P takes a confidence floor"):
            build_methods(gen, f"vanilla,{AUTO_FLOOR}:{bad}", [], greedy=True)

def test_the_warm_up_builds_auto_statics_shapes_too():
    """A bench's warm-up runs the generator's own (the methods' trees) and, for `auto-static`
    alone, another with its setting on (its static shapes' head steps are not auto's), without the
    vanilla runs: no graph is built inside a timed run. The generator's setting is restored."""
    from eaglespec.bench.methods import AUTO_FIXED, AUTO_STATIC, AUTO_WHOLE, warm_methods

    from eaglespec.core.tree import static_tree
    from eaglespec.engine.tuning import TunedTree

    gen = tiny_generator()
    small, big = static_tree([(0,)]), static_tree([(0,), (1,), (0, 0)])
    gen.tuned = TunedTree(big, 2.0, 1.5, [(1, 1.6, 0.001, 0.010, 1.45), (3, 2.0, 0.002, 0.010, 1.67)], 0.010,
                          trees=((1, small), (3, big)))
    gen.tree = big
    seen = []
    gen.warm = lambda contexts, trees=(), vanilla=True: seen.append((contexts, vanilla, gen.rerank))
    methods, _ = build_methods(gen, f"vanilla,{AUTO_FIXED},{AUTO_WHOLE},{AUTO_STATIC}", [], greedy=True)
    warm_methods(gen, methods, (40, 600))
    assert seen == [((40, 600), True, True), ((40, 600), False, False)]  # vanilla's steps once
    assert gen.rerank is True
    seen.clear()
    warm_methods(gen, build_methods(gen, f"vanilla,{AUTO_FIXED}", [], greedy=True)[0], (40,))
    assert [r for _, _, r in seen] == [True]


# -- the harness on a tiny model -----------------------------------------------------------------

QUESTIONS = [Question("1", "alpha", (words(10, 11, 12, 13), words(20, 21))),
             Question("2", "beta", (words(30, 31, 32), words(40, 41, 42, 43)))]


def _execute(gen, methods, out, **kw):
    meta = run_metadata(gen, methods, command="test", head="random", dataset="tiny")
    kw = {"max_new_tokens": 8, "sampling": SamplingParams(), "turns": 2, "progress": False, **kw}
    return execute(gen, QUESTIONS, methods, out, meta, **kw)


def test_harness_writes_json_table_and_plots(gen, tmp_path):
    # eagle1 (25 nodes, 5 levels) is left to the parsing test: on a CPU it is the slowest to draft
    methods, _ = build_methods(gen, "vanilla,chain,dynamic:2,2,4,hf,pld", [2], greedy=True)
    assert _execute(gen, methods, tmp_path) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["lossless"] is True and data["failures"] == []
    meta = data["meta"]
    assert {"threads", "dtype", "device", "date", "command", "model", "head", "methods"} <= set(meta)
    assert meta["dtype"] == "float64" and meta["prompts"] == 4
    records = data["records"]
    assert len(records) == 4 * len(methods)  # 2 questions x 2 turns x methods
    vanilla = {(r["question_id"], r["turn"]): r for r in records if r["method"] == BASELINE}
    for r in records:
        assert r["new_tokens"] == len(r["token_ids"]) > 0 and r["elapsed"] > 0
        if r["method"] in ("chain:2", "dynamic:2,2,4"):
            assert r["token_ids"] == vanilla[(r["question_id"], r["turn"])]["token_ids"]
            assert r["matches_vanilla"] is True and len(r["accepted"]) == len(r["emitted"]) > 0
        if r["method"] == HF_GENERATE:
            assert r["accepted"] is None
    # the second turn holds the first turn and vanilla's answer
    for qid in ("1", "2"):
        assert vanilla[(qid, 2)]["prompt_tokens"] > vanilla[(qid, 1)]["prompt_tokens"] + vanilla[(qid, 1)]["new_tokens"]
    # the order rotates by one per prompt: method k % m runs first for prompt k
    firsts = [r["method"] for r in records if r["order"] == 0]
    assert firsts == [m.name for m in methods][:4]
    s = data["summary"]
    assert list(s) == [m.name for m in methods] and s[BASELINE]["speedup"] == 1.0
    assert len(s["chain:2"]["n_alpha"]) == 2 and s["chain:2"]["tau"] >= 1.0
    table = (tmp_path / "results.md").read_text()
    for m in methods:
        assert f"| {m.name} |" in table
    assert "identical" in table and "n-alpha" in table.lower()
    for name in PLOTS:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".*tmp"))


def test_non_lossless_method_fails_the_run(gen, tmp_path, capsys):
    methods, _ = build_methods(gen, "vanilla,chain:2", [], greedy=True)
    methods.append(AlteredMethod(methods[1], gen.target.vocab_size))
    code = _execute(gen, methods, tmp_path, turns=1, plots=False, warmup=False)
    assert code == EXIT_NOT_LOSSLESS
    assert "LOSSLESSNESS FAILURE" in capsys.readouterr().err
    data = json.loads((tmp_path / "results.json").read_text())  # results are written all the same
    assert data["lossless"] is False and len(data["failures"]) == 2
    assert all(f.startswith("broken differs from vanilla") for f in data["failures"])
    assert {r["method"]: r["matches_vanilla"] for r in data["records"]} == {BASELINE: None, "chain:2": True, "broken": False}
    assert "LOSSLESSNESS FAILURES" in (tmp_path / "results.md").read_text()


def test_interrupted_run_resumes_from_its_journal(gen, tmp_path):
    methods, _ = build_methods(gen, "vanilla,chain:2", [], greedy=True)
    # 4 prompts x 2 methods; Ctrl-C on the 3rd prompt's second method: two prompts are journaled
    counting = [CountingMethod(methods[0]), CountingMethod(methods[1], interrupt_at=3)]
    with pytest.raises(KeyboardInterrupt):
        _execute(gen, counting, tmp_path, plots=False, warmup=False)
    assert not (tmp_path / "results.json").exists()
    lines = (tmp_path / Journal.NAME).read_text().splitlines()
    assert len(lines) == 3 and "settings" in json.loads(lines[0])
    kept = {(json.loads(x)["question_id"], json.loads(x)["turn"]) for x in lines[1:]}
    assert kept == {("1", 1), ("1", 2)}
    with open(tmp_path / Journal.NAME, "a") as f:
        f.write('{"question_id": "2", "turn": 1, "entr')  # a line torn by the interruption: ignored
    resumed = [CountingMethod(m) for m in methods]
    assert _execute(gen, resumed, tmp_path, plots=False, warmup=False) == 0
    assert [m.calls for m in resumed] == [2, 2]  # only the two prompts left
    data = json.loads((tmp_path / "results.json").read_text())
    assert len(data["records"]) == 8 and data["lossless"] and data["meta"]["prompts"] == 4
    # the journaled prompts are the first run's records, the others equal a fresh run's
    # the torn line was cut off: the journal now reads back every prompt
    assert len(Journal(tmp_path, json.loads(lines[0])["settings"]).done) == 4
    fresh = tmp_path / "fresh"
    assert _execute(gen, methods, fresh, plots=False, warmup=False) == 0
    fresh_records = json.loads((fresh / "results.json").read_text())["records"]
    assert [r["token_ids"] for r in data["records"]] == [r["token_ids"] for r in fresh_records]
    first = json.loads(lines[1])["entries"]
    assert [r["elapsed"] for r in data["records"][:2]] == [e["record"]["elapsed"] for e in first]


def test_resume_refuses_other_settings(gen, tmp_path):
    methods, _ = build_methods(gen, "vanilla", [], greedy=True)
    assert _execute(gen, methods, tmp_path, plots=False, warmup=False, turns=1) == 0
    with pytest.raises(EagleError, match="max_new_tokens differ.*another --out"):
        _execute(gen, methods, tmp_path, plots=False, warmup=False, turns=1, max_new_tokens=4)
    before, gen.draft_vocab = gen.draft_vocab, torch.arange(16)  # another draft vocabulary: other speeds
    try:
        with pytest.raises(EagleError, match="draft_vocab differ.*another --out"):
            _execute(gen, methods, tmp_path, plots=False, warmup=False, turns=1)
    finally:
        gen.draft_vocab = before
    gen.use_draft_dtype("bfloat16")  # the head in another dtype: other speeds
    try:
        with pytest.raises(EagleError, match="draft_dtype differ.*another --out"):
            _execute(gen, methods, tmp_path, plots=False, warmup=False, turns=1)
    finally:
        gen.use_draft_dtype("auto")
    (tmp_path / Journal.NAME).write_text('{"settings"')  # killed while writing its first line: a new run
    assert _execute(gen, methods, tmp_path, plots=False, warmup=False) == 0
    (tmp_path / Journal.NAME).write_text("not json\n")
    with pytest.raises(EagleError, match="not a bench journal"):
        _execute(gen, methods, tmp_path, plots=False, warmup=False)


def test_differing_reference_is_only_a_warning(gen):
    methods, _ = build_methods(gen, "vanilla", [], greedy=True)
    methods.append(AlteredMethod(methods[0], gen.target.vocab_size, name="hf-like", kind="reference"))
    result = run_bench(QUESTIONS[:1], methods, lambda m: gen.encode(messages=m), gen.decode,
                       max_new_tokens=8, warmup=False, progress=False)
    assert result.lossless and len(result.warnings) == 1 and "hf-like" in result.warnings[0]


def test_sampling_run_skips_the_equality_check(gen):
    methods, _ = build_methods(gen, "vanilla,chain", [2], greedy=False)
    result = run_bench(QUESTIONS, methods, lambda m: gen.encode(messages=m), gen.decode, max_new_tokens=8,
                       sampling=SamplingParams(temperature=1.0, seed=0, mode="speculative"), warmup=False, progress=False)
    assert result.lossless and len(result.entries) == 4
    assert all(e.matches_vanilla is None for e in result.entries)


def test_register_adds_bench_and_validates_before_loading(tmp_path):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "--limit", "0", "--out", str(tmp_path)])
    assert args.dataset == "mt-bench" and args.turns == 1 and args.max_new_tokens == 256
    with pytest.raises(EagleError, match="--limit"):
        args.func(args)  # fails on the option, before any model is loaded
    args = parser.parse_args(["bench", "--dataset", str(tmp_path / "missing.jsonl")])
    with pytest.raises(EagleError, match="not found"):
        args.func(args)


# -- bench-modes: both sampling modes side by side -------------------------------------------------
def test_bench_modes_writes_one_table_of_both_modes(gen, tmp_path, capsys):
    from eaglespec.bench import modes

    args = argparse.ArgumentParser()
    sub = args.add_subparsers()
    modes.register(sub)
    parsed = args.parse_args(["bench-modes", "--temperature", "0.7,1.0", "--top-p", "0.9,1.0", "--paired",
                              "--seed", "3", "--methods", "chain:2,dynamic:2,2,4"])
    settings = modes.sampling_settings(parsed)
    assert [(s.temperature, s.top_p, s.seed) for s in settings] == [(0.7, 0.9, 3), (1.0, 1.0, 3)]
    methods = modes.mode_methods(gen, parsed.methods, modes.parse_modes(parsed.sampling_mode), "eagle1")
    assert [m.name for m in methods] == ["vanilla", "vanilla[reproducible]", "chain:2[speculative]",
                                         "chain:2[reproducible]", "dynamic:2,2,4[speculative]", "dynamic:2,2,4[reproducible]"]
    meta = run_metadata(gen, methods, command="test", head="random", dataset="tiny", max_new_tokens=8, seed=3)
    data = modes.run_modes(gen, QUESTIONS, methods, settings, tmp_path, max_new_tokens=8, meta=meta, progress=False,
                           warmup=False)
    assert modes.write_and_verdict(data, tmp_path) == 0
    rows = data["rows"]
    assert len(rows) == 2 * len(methods)
    for r in rows:
        assert r["prompts"] == 2 and r["tokens_per_s"] > 0
        if r["method"] != "vanilla":
            assert r["tau"] >= 1 and 0 <= r["alpha1"] <= 1 and r["accepted_per_step"] == pytest.approx(r["tau"] - 1)
        assert r["identical"] == (2 if r["mode"] == "reproducible" and r["method"] != "vanilla" else None)
    md = (tmp_path / "modes.md").read_text()
    assert "| 0.7 | 0.9 | reproducible | chain:2 |" in md and "| 2/2 |" in md
    assert (tmp_path / "t0.7-p0.9" / "results.json").exists() and json.loads((tmp_path / "modes.json").read_text())["rows"]
    # resumed: the journals hold every prompt, nothing runs again
    again = modes.run_modes(gen, QUESTIONS, methods, settings, tmp_path, max_new_tokens=8, meta=meta, progress=False)
    assert [r["tokens"] for r in again["rows"]] == [r["tokens"] for r in rows]


@pytest.mark.parametrize("argv, message", [
    (["--sampling-mode", "speculative,gumbel"], "--sampling-mode takes speculative,reproducible"),
    (["--temperature", "0.7,hot"], "--temperature takes comma-separated numbers"),
    (["--temperature", "0"], "--temperature must be > 0"),
    (["--temperature", "0.7,1.0", "--top-p", "0.9", "--paired"], "--paired needs as many"),
    (["--seed", str(2**64)], "seed must be an integer"),
    (["--allow-inexact"], "--sampling-mode reproducible cannot hold with --allow-inexact"),
])
def test_bench_modes_bad_options_fail_before_loading(argv, message, capsys):
    from eaglespec.cli.commands import main

    assert main(["bench-modes", *argv]) == 2
    assert message in capsys.readouterr().err


def test_vanilla_eager_runs_the_eager_kernels_beside_the_generators_own_and_puts_them_back():
    """The `vanilla-eager` method (`eager`): vanilla decoding on EagerSteps whatever path the
    generator runs (here a counting stand-in for the compiled one), the same ids as the baseline
    on these fp64 kernels, and the generator's own path restored afterwards."""
    from eaglespec.bench.methods import EAGER
    from eaglespec.engine.target import EagerSteps

    calls = []

    class OwnPath(EagerSteps):
        name = "own"

        def verify_rows(self, *args, **kwargs):
            calls.append(1)
            return super().verify_rows(*args, **kwargs)

    gen = tiny_generator()
    own = gen.target.steps = OwnPath(gen.target)
    methods, _ = build_methods(gen, "vanilla,eager", [], greedy=True)
    assert [m.name for m in methods] == [BASELINE, EAGER] and methods[1].kind == "reference"
    ids = gen.encode("hello there")
    gen.eos_token_ids = set  # no stop token: every run makes its 20 tokens
    baseline = methods[0].run(ids, 20, SamplingParams())
    assert calls and gen.target.steps is own
    calls.clear()
    eager = methods[1].run(ids, 20, SamplingParams())
    assert not calls and gen.target.steps is own  # eager kernels only, and the generator's path put back
    assert eager.token_ids == baseline.token_ids and len(eager.token_ids) == 20
