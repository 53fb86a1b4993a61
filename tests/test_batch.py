"""Batched decoding: every sequence of a batch decodes exactly as it does alone (greedy), keeps
the target's distribution (sampling), and sequences may join and leave between steps."""

import pytest
import torch
from conftest import ARCHS, second_token_marginal, tiny_target
from oracle import OracleDrafter
from test_decoding import SHAPES, assert_same_or_tie, random_head
from test_eagle3 import eagle3_head
from test_verify import chi_square_fits

from eaglespec.core.config import SamplingParams, parse_tree
from eaglespec.engine.batch import Batch
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.engine.kv_cache import RowCache, keep_path, move_paths

# prompts of different lengths, so rows are padded; budgets differ, so rows leave at different steps
PROMPTS = [[5, 17, 33, 9, 64, 21, 7, 90, 11, 3], [8, 4], [40, 41, 42, 43, 44, 45], [99, 2, 71, 15, 30]]
BUDGETS = [40, 25, 33, 1]


def alone(gen, prompt, max_new, speculative=True):
    return gen.generate(input_ids=prompt, max_new_tokens=max_new, speculative=speculative, stop_token_ids=set()).token_ids


def together(gen, prompts, budgets, speculative=True, tree="default"):
    batch = Batch(gen.target, gen._drafter(gen.tree if tree == "default" else tree) if speculative else None)
    outputs = {}
    for i, (p, b) in enumerate(zip(prompts, budgets)):
        seq, first = batch.add(p, b, SamplingParams(), set())
        outputs[id(seq)] = (i, list(first.tokens))
    sizes = []
    while len(batch):
        sizes.append(len(batch))
        for seq, out in batch.step():
            outputs[id(seq)][1].extend(out.tokens)
    return [tokens for _, tokens in sorted(outputs.values())], sizes


# ---- the cache rows -----------------------------------------------------------------------------
def test_row_cache_keeps_each_rows_path_like_a_fresh_prefill():
    """Rows of different lengths, a tree appended to all, different accepted paths: each row's
    kept entries equal a one-row cache compacted alone (which test_target checks against a fresh
    prefill)."""
    target = tiny_target("llama")
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[2]]
    paths = [torch.tensor([0, 2, 3]), torch.tensor([0]), torch.tensor([0, 1])]
    tree_mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    depth = torch.tensor([0, 1, 1, 2])
    trees = torch.tensor([[3, 4, 5, 6], [7, 8, 9, 10], [11, 12, 13, 14]])
    rows, singles = None, []
    for p, tokens, path in zip(prompts, trees, paths):
        one = target.new_cache()
        target.forward(torch.tensor([p]), one)
        single = target.new_cache()
        target.forward(torch.tensor([p]), single)
        target.forward(tokens[None], single, tree_mask, depth)
        keep_path(single, len(p), path)
        singles.append(single)
        if rows is None:
            rows = RowCache(one, [len(p)])
        else:
            rows.extend(RowCache(one, [len(p)]))
    start = rows.length
    target.forward_rows(trees, rows, tree_mask.expand(3, -1, -1), depth.expand(3, -1))
    rows.keep_paths(start, paths)
    assert rows.lens.tolist() == [len(p) + len(path) for p, path in zip(prompts, paths)]
    for r, single in enumerate(singles):
        n = int(rows.lens[r])
        for mine, ref in zip(rows.cache.layers, single.layers):
            torch.testing.assert_close(mine.keys[r, :, :n], ref.keys[0], rtol=1e-9, atol=1e-9)
            torch.testing.assert_close(mine.values[r, :, :n], ref.values[0], rtol=1e-9, atol=1e-9)
    rows.select([2, 0])
    assert rows.lens.tolist() == [len(prompts[2]) + 2, len(prompts[0]) + 3]
    torch.testing.assert_close(rows.cache.layers[0].keys[1, :, :13], singles[0].layers[0].keys[0])


def test_moving_paths_in_a_stack_of_buffers_moves_each_as_alone():
    """move_paths over a [layers, B, heads, S, d] stack (the compiled cache's one tensor) leaves
    every layer as moving it alone does, padding rows untouched."""
    torch.manual_seed(0)
    stack = torch.randn(4, 3, 2, 12, 5)
    alone = [t.clone() for t in stack]
    lens, paths = torch.tensor([2, 5]), [torch.tensor([0, 3, 4]), torch.tensor([0, 2])]
    move_paths([stack], lens, 6, paths)
    move_paths(alone, lens, 6, paths)
    assert torch.equal(stack, torch.stack(alone))
    assert torch.equal(stack[:, 0, :, 2:5], torch.stack(alone)[:, 0, :, [6, 9, 10]])  # it moved


# ---- greedy: each sequence as alone --------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tree", ["eagle1", "dynamic:3,4,10"])
def test_batched_eagle_equals_each_sequence_alone(arch, tree):
    target = tiny_target(arch)
    gen = EagleGenerator(target, random_head(target), tree)
    outs, sizes = together(gen, PROMPTS, BUDGETS)
    assert sizes[0] == 3 and sizes[-1] == 1  # the one-token sequence finished at its prefill; the rest left one by one
    for prompt, budget, out in zip(PROMPTS, BUDGETS, outs):
        ref = alone(gen, prompt, budget, speculative=False)
        assert len(out) == budget
        assert_same_or_tie(target, prompt, ref, out)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_batched_eagle3_equals_each_sequence_alone(arch):
    target = tiny_target(arch)
    gen = EagleGenerator(target, eagle3_head(target), "dynamic:3,4,10")
    outs, _ = together(gen, PROMPTS, BUDGETS)
    for prompt, budget, out in zip(PROMPTS, BUDGETS, outs):
        assert_same_or_tie(target, prompt, alone(gen, prompt, budget, speculative=False), out)


def test_batched_always_right_drafter_accepts_everything_per_row():
    """The acceptance path in a batch: each row accepts its own (full) path and stays vanilla's."""
    target = tiny_target("llama")
    drafter = OracleDrafter(target, PROMPTS[0], SHAPES["eagle1"], prompts=PROMPTS)
    gen = EagleGenerator(target, drafter=drafter)
    batch = Batch(target, drafter)
    seqs = [batch.add(p, 30, SamplingParams(), set())[0] for p in PROMPTS]
    outs = {id(s): [] for s in seqs}
    accepted = []
    while len(batch):
        for seq, out in batch.step():
            outs[id(seq)].extend(out.tokens)
            accepted.append(out.stats.accepted)
    depth = max(len(drafter._ancestors(n)) for n in range(drafter.max_nodes))
    assert accepted.count(depth) >= len(accepted) - len(PROMPTS)  # all but each row's last (cut) step
    for prompt, seq in zip(PROMPTS, seqs):
        ref = alone(gen, prompt, 30, speculative=False)
        assert ref[1:] == outs[id(seq)]


def test_vanilla_batches_too():
    target = tiny_target("mistral")
    gen = EagleGenerator(target, None, None)
    outs, sizes = together(gen, PROMPTS, BUDGETS, speculative=False)
    assert sizes[0] == 3
    for prompt, budget, out in zip(PROMPTS, BUDGETS, outs):
        assert_same_or_tie(target, prompt, alone(gen, prompt, budget, speculative=False), out)


def test_sequences_join_and_leave_between_steps():
    """Continuous batching: a sequence joining a running batch (and one leaving early, as a
    cancelled request does) changes no other sequence's output."""
    target = tiny_target("qwen2")
    gen = EagleGenerator(target, random_head(target), "eagle1")
    batch = Batch(target, gen._drafter(gen.tree))
    outs = {}
    a, first = batch.add(PROMPTS[0], 30, SamplingParams(), set())
    outs[id(a)] = list(first.tokens)
    for step in range(12):
        if step == 2:
            b, first = batch.add(PROMPTS[1], 20, SamplingParams(), set())
            outs[id(b)] = list(first.tokens)
        if step == 4:
            c, first = batch.add(PROMPTS[2], 6, SamplingParams(), set())
            outs[id(c)] = list(first.tokens)
        if step == 7:
            batch.remove([b])  # cancelled
        for seq, out in batch.step():
            outs[id(seq)].extend(out.tokens)
    while len(batch):
        for seq, out in batch.step():
            outs[id(seq)].extend(out.tokens)
    assert outs[id(a)] == alone(gen, PROMPTS[0], 30, speculative=False)
    assert outs[id(c)] == alone(gen, PROMPTS[2], 6, speculative=False)
    ref_b = alone(gen, PROMPTS[1], 20, speculative=False)
    assert outs[id(b)] == ref_b[: len(outs[id(b)])] and len(outs[id(b)]) < 20


def test_generate_batch_api():
    target = tiny_target("llama")
    gen = EagleGenerator(target, random_head(target), "chain:3")
    results = gen.generate_batch(input_ids=PROMPTS[:3], max_new_tokens=12, stop_token_ids=set())
    for prompt, result in zip(PROMPTS, results):
        assert result.token_ids == alone(gen, prompt, 12, speculative=False)
        assert result.steps and result.elapsed > 0


def test_copies_of_a_prompt_share_one_prefill_and_sample_as_if_prefilled_alone(monkeypatch):
    """generate_batch prefills a repeated prompt once and copies its cache (certify's draws): the
    samples are the ones separate prefills give, seed for seed."""
    target = tiny_target("qwen2")
    gen = EagleGenerator(target, random_head(target), "eagle1")
    prompts = [PROMPTS[0]] * 3 + [PROMPTS[2]] * 2 + [PROMPTS[0]]
    calls = []
    forward_states = target.forward_states
    monkeypatch.setattr(target, "forward_states", lambda ids, *a, **k: calls.append(ids.shape) or forward_states(ids, *a, **k))
    shared = gen.generate_batch(input_ids=prompts, max_new_tokens=10, temperature=1.0, seed=7, stop_token_ids=set(),
                                 sampling_mode="speculative")
    prefills = [c for c in calls if c[1] > 1]
    assert [c[1] for c in prefills] == [len(PROMPTS[0]), len(PROMPTS[2]), len(PROMPTS[0])]
    monkeypatch.setattr(target, "forward_states", forward_states)
    from eaglespec.engine.batch import Batch

    add = Batch.add
    monkeypatch.setattr(Batch, "add", lambda self, *a, keep_prefill=False, **k: add(self, *a, **k))  # no sharing
    separate = gen.generate_batch(input_ids=prompts, max_new_tokens=10, temperature=1.0, seed=7, stop_token_ids=set(),
                                 sampling_mode="speculative")
    assert [r.token_ids for r in shared] == [r.token_ids for r in separate]
    assert len({tuple(r.token_ids) for r in shared[:3]}) > 1  # the copies did sample differently


# ---- sampling: the target's distribution, in a batch ---------------------------------------------
def test_sampling_in_a_batch_keeps_the_target_distribution():
    """A sequence's second token (its first verified one) follows the target's marginal
    sum_a p(a | prompt) p(b | prompt, a) while it shares every step with other sequences."""
    target = tiny_target("llama")
    with torch.no_grad():
        target.lm_head.weight.div_(4.0)  # spread p over many tokens
    prompt = PROMPTS[0]
    gen = EagleGenerator(target, random_head(target), "dynamic:3,2,4")
    counts = torch.zeros(target.vocab_size)
    for seed in range(600):  # the prompt in rows 0 and 2, another in row 1: 1,200 draws
        results = gen.generate_batch(input_ids=[prompt, PROMPTS[2], prompt], max_new_tokens=2, temperature=1.0,
                                     seed=3 * seed, stop_token_ids=set(), sampling_mode="speculative")
        for r in (results[0], results[2]):
            counts[r.token_ids[1]] += 1
    ok, stat, critical = chi_square_fits(counts, second_token_marginal(target, prompt))
    assert ok, f"chi2 {stat:.1f} > {critical:.1f}"


def test_a_confidence_floor_keeps_the_target_distribution_and_the_seeded_sample():
    """With a floor, a lone sequence's tree is cut by its draft's confidence (trees of several sizes
    across seeds): the second token (the first one a tree verifies) still follows the target's
    marginal, and in reproducible mode a seeded sample is still vanilla's. A batch of several
    sequences drafts its trees whole."""
    import collections

    target = tiny_target("llama")
    with torch.no_grad():
        target.lm_head.weight.div_(4.0)  # spread p and q over many tokens
    gen = EagleGenerator(target, random_head(target), "eagle1")
    gen.draft_floor = 0.01  # about q's top probability here: nodes fall on both sides of it
    prompt = PROMPTS[2]
    counts, sizes = torch.zeros(target.vocab_size), collections.Counter()
    for seed in range(1200):
        r = gen.generate(input_ids=prompt, max_new_tokens=3, temperature=1.0, seed=seed, stop_token_ids=set(),
                         sampling_mode="speculative")
        counts[r.token_ids[1]] += 1
        sizes[r.steps[0].tree_size] += 1  # the tree that verified the second token
    assert len(sizes) >= 2 and max(sizes) < gen.tree.num_nodes, sizes
    ok, stat, critical = chi_square_fits(counts, second_token_marginal(target, prompt))
    assert ok, f"chi2 {stat:.1f} > {critical:.1f}"
    for seed in range(3):
        vanilla = gen.generate(input_ids=PROMPTS[0], max_new_tokens=24, temperature=1.0, seed=seed, speculative=False,
                               stop_token_ids=set(), sampling_mode="reproducible")
        eagle = gen.generate(input_ids=PROMPTS[0], max_new_tokens=24, temperature=1.0, seed=seed,
                             stop_token_ids=set(), sampling_mode="reproducible")
        assert eagle.token_ids == vanilla.token_ids
    together = gen.generate_batch(input_ids=[prompt, PROMPTS[0]], max_new_tokens=3, temperature=1.0, seed=0,
                                  stop_token_ids=set(), sampling_mode="speculative")
    assert all(r.steps[0].tree_size == gen.tree.num_nodes for r in together)


def test_the_tree_may_change_between_steps_with_the_batch_size():
    """--tree auto by batch size: a big tree alone, a small one for two, no drafts for three or
    more; sequences join and leave, so every kind of step (and the head catching up on the pairs
    it skipped) happens, and each output stays its vanilla one."""
    target = tiny_target("llama")
    gen = EagleGenerator(target, random_head(target), "eagle1")
    trees = {1: gen._drafter(gen.tree), 2: gen._drafter(parse_tree("chain:2"))}
    used = []

    def choose(size):
        used.append(size)
        return trees.get(size)

    batch = Batch(target, trees[1], choose)
    budgets = [36, 12, 20, 5]
    outs = {}
    for i, (prompt, budget) in enumerate(zip(PROMPTS, budgets)):
        seq, first = batch.add(prompt, budget, SamplingParams(), set())
        outs[i] = (seq, list(first.tokens))
        for _ in range(3):
            for s, out in batch.step():
                next(v for v in outs.values() if v[0] is s)[1].extend(out.tokens)
    while len(batch):
        for s, out in batch.step():
            next(v for v in outs.values() if v[0] is s)[1].extend(out.tokens)
    assert {1, 2, 3} <= set(used)
    for i, (prompt, budget) in enumerate(zip(PROMPTS, budgets)):
        assert outs[i][1] == alone(gen, prompt, budget, speculative=False), i


def test_bench_batch_measures_each_size_side_by_side(tmp_path):
    from eaglespec.bench.batching import markdown, measure, parse_sizes, plot
    from eaglespec.errors import EagleError

    assert parse_sizes("4,1,2,2") == [1, 2, 4]
    with pytest.raises(EagleError, match="positive integers"):
        parse_sizes("0,2")
    target = tiny_target("llama")
    gen = EagleGenerator(target, random_head(target), "chain:2")
    rows = measure(gen, PROMPTS, [1, 3], max_new_tokens=6, rounds=1)
    assert [r["batch"] for r in rows] == [1, 3]
    for r in rows:
        assert r["identical"] == r["sequences"] and r["vanilla_tokens_per_s"] > 0 and r["eagle_tokens_per_s"] > 0
        assert r["speedup"] == pytest.approx(r["eagle_tokens_per_s"] / r["vanilla_tokens_per_s"], rel=0.01)
    meta = {"command": "x", "dataset": "d", "model": "m", "head": "h", "tree": "chain:2", "device_name": "cpu",
            "threads": 1, "max_new_tokens": 6, "rounds": 1}
    assert "| 3 |" in markdown(rows, meta)
    plot(rows, tmp_path / "batch.png")
    assert (tmp_path / "batch.png").stat().st_size > 0


def test_batched_acceptance_equals_decoding_each_prompt_alone(tmp_path):
    """`python -m eaglespec.bench.acceptance` measures tau in batches: each step's accepted length must
    be the one decoding the prompt alone gives, and every output is checked against vanilla."""
    from eaglespec.bench.acceptance import main, markdown, measure

    target = tiny_target("llama")
    head = random_head(target, seed=3)
    h = target.config.hidden_size
    with torch.no_grad():  # a head that drafts "the last token again": tiny random models repeat, so it is accepted
        head.fc.weight.zero_(), head.fc.bias.zero_(), head.fc.weight[:, h:].copy_(torch.eye(h))
        head.decoder.layers[0].self_attn.o_proj.weight.zero_(), head.decoder.layers[0].mlp.down_proj.weight.zero_()
    gen = EagleGenerator(target, head, "eagle1")
    trees = ["eagle1", "chain:3"]
    rows, vanilla_tokens = measure(gen, PROMPTS, trees, batch=3, max_new_tokens=12)
    assert vanilla_tokens == sum(len(gen.generate(input_ids=p, max_new_tokens=12, speculative=False).token_ids)
                                 for p in PROMPTS)
    for tree, row in zip(trees, rows):
        alone_steps = [s for p in PROMPTS
                       for s in gen.generate(input_ids=p, max_new_tokens=12, tree=tree).steps]
        assert row["steps"] == len(alone_steps) and row["identical"] == row["prompts"] == len(PROMPTS)
        assert row["tau"] == pytest.approx(sum(s.emitted for s in alone_steps) / len(alone_steps), abs=1e-3)
        assert len(row["n_alpha"]) == 4
    assert rows[0]["tau"] > 1.3  # drafts were accepted: the comparison above is not of empty steps
    text = markdown(rows, {"head": "h", "dataset": "d", "prompts": 4, "command": "x", "max_new_tokens": 12,
                           "batch": 3, "vanilla_tokens": vanilla_tokens})
    assert "| `chain:3` |" in text and "4/4" in text
    with pytest.raises(SystemExit):  # auto depends on the batch size: refused with a message
        main(["--trees", "auto", "--out", str(tmp_path)])
