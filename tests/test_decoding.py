"""Greedy equality: EAGLE output equals vanilla greedy token for token, on tiny models of every
supported architecture, with an always-right drafter and a random (almost always wrong) head."""

import pytest
import torch
from conftest import ARCHS, tiny_target
from oracle import OracleDrafter

from eaglespec.core.config import DynamicTreeSpec, parse_tree
from eaglespec.draft.head import EagleHead
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.errors import EagleError

PROMPT = [5, 17, 33, 9, 64, 21, 7, 90, 11, 3]
TREES = ["eagle1", "chain:3", "dynamic:3,4,10"]
SHAPES = {  # parents arrays for the oracle: a chain, EAGLE-1's tree
    "chain": [-1, 0, 1, 2, 3, 4],
    "eagle1": parse_tree("eagle1").parents.tolist(),
    "bushy": [-1, 0, 0, 0, 1, 1, 2, 4, 4, 7],
}


def assert_same_or_tie(target, prompt, vanilla, eagle):
    """Equal token for token; a divergence is allowed only at a genuine rounding tie (the target's
    top-2 logits within 1e-9 at that position), which float64 makes vanishingly rare."""
    if vanilla == eagle:
        return
    i = next(i for i, (a, b) in enumerate(zip(vanilla, eagle)) if a != b) if any(
        a != b for a, b in zip(vanilla, eagle)) else min(len(vanilla), len(eagle))
    logits = target.model(torch.tensor([prompt + vanilla[:i]])).logits[0, -1]
    top2 = logits.topk(2).values
    assert (top2[0] - top2[1]).abs() < 1e-9, f"outputs diverge at token {i} without a tie: {vanilla[i:i+5]} vs {eagle[i:i+5]}"


def random_head(target, seed=1, layers=1):
    torch.manual_seed(seed)
    return EagleHead(target.config, layers=layers).to(target.dtype)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tree", TREES)
def test_random_head_equals_vanilla(arch, tree):
    target = tiny_target(arch)
    gen = EagleGenerator(target, random_head(target), tree)
    vanilla = gen.generate(input_ids=PROMPT, max_new_tokens=64, speculative=False, stop_token_ids=set())
    eagle = gen.generate(input_ids=PROMPT, max_new_tokens=64, stop_token_ids=set())
    assert len(vanilla.token_ids) == 64
    assert_same_or_tie(target, PROMPT, vanilla.token_ids, eagle.token_ids)
    assert all(s.tree_size > 1 for s in eagle.steps[:-1])  # no draft for a last single token


def counted_levels(monkeypatch) -> list:
    """A list that grows by one item for each level a drafter drafts below the first."""
    from eaglespec.draft.drafter import Drafter

    levels, expand = [], Drafter._expand
    monkeypatch.setattr(Drafter, "_expand", lambda self, *a: levels.append(1) or expand(self, *a))
    return levels


@pytest.mark.parametrize("arch,layers", [("llama", 1), ("llama", 2), ("qwen3", 2), ("mixtral", 2)])
def test_each_draft_is_the_heads_teacher_forced_prediction(arch, layers):
    """While decoding (chain:1), every draft is the argmax of the head run once, causally, over the
    whole generated sequence's pairs (f[t], x[t+1]) (training's view): the head's cache holds every
    layer's entries of the accepted path, for a head of one layer or more."""
    target = tiny_target(arch)
    assert_drafts_are_teacher_forced(target, random_head(target, layers=layers))


def assert_drafts_are_teacher_forced(target, head):
    gen = EagleGenerator(target, head, "chain:1")
    batch, pairs, emitted = gen.new_batch(), [], [0]

    def observe(tree, logits, acc):
        pairs.append((len(PROMPT) + sum(emitted), tree.tokens.reshape(-1).tolist()))
        emitted.append(len(acc.accepted_tokens) + 1)

    batch.add(PROMPT, 40, stops=set())
    while len(batch):
        batch.step(observe)
    vanilla = gen.generate(input_ids=PROMPT, max_new_tokens=40, speculative=False, stop_token_ids=set())
    full = torch.tensor(PROMPT + list(vanilla.token_ids))
    with torch.no_grad():
        f = target.features(full[None])[0]
        out = head(target.embed_tokens(full[1:])[None].to(target.dtype), f[None, :-1])
        predicted = target.logits(out)[0].argmax(-1)
    assert len(pairs) > 10 and all(len(tokens) == 2 for _, tokens in pairs[:-1])  # a last single token: no draft
    for n, tokens in pairs[:-1]:
        assert int(full[n]) == tokens[0]  # this step's root is the sequence's token n
        assert tokens[1] == int(predicted[n - 1]), n  # drafted from (f[n-1], x[n])


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tree", ["eagle1", "chain:4"])
def test_a_confidence_floor_verifies_less_and_keeps_the_output(arch, tree, monkeypatch):
    """With a floor, a static tree verifies only the nodes whose path probability under the draft
    reaches it, and does not draft a level none of whose nodes do: the trees vary from step to
    step, the head runs fewer times, and the output is still vanilla's."""
    target = tiny_target(arch)
    gen = EagleGenerator(target, random_head(target), tree)
    levels = counted_levels(monkeypatch)
    vanilla = gen.generate(input_ids=PROMPT, max_new_tokens=64, speculative=False, stop_token_ids=set())
    whole = gen.generate(input_ids=PROMPT, max_new_tokens=64, stop_token_ids=set())
    whole_levels, full = len(levels), gen.tree.num_nodes
    assert {s.tree_size for s in whole.steps[:-1]} == {full}
    gen.draft_floor = 0.02  # a random head over 128 tokens: some depth-1 nodes above it, few below
    levels.clear()
    floored = gen.generate(input_ids=PROMPT, max_new_tokens=64, stop_token_ids=set())
    assert_same_or_tie(target, PROMPT, vanilla.token_ids, floored.token_ids)
    sizes = [s.tree_size for s in floored.steps]
    assert len(set(sizes)) >= 2 and max(sizes) < full, sizes  # the trees follow the draft's confidence
    assert len(levels) < whole_levels / 2  # levels below the floor are not drafted
    # each step says the levels it drafted: its first, and one head forward for each below it
    assert sum(s.levels - 1 for s in floored.steps) == len(levels) > 0
    gen.draft_floor = 0.0005  # low enough that some steps keep depth-2 nodes
    seen = []
    for _ in gen.stream(PROMPT, 64, stop_token_ids=set(), observe=lambda t, logits, acc: seen.append(t)):
        pass
    assert any(int(t.buffers.tree_position_ids.max()) >= 2 for t in seen)
    static = gen.tree.buffers.tree_position_ids.bincount().tolist()
    for t in seen:  # each a part of the static tree closed under parents, its nodes at their own depths
        assert all(a <= b for a, b in zip(t.buffers.tree_position_ids.bincount().tolist(), static))
        if tree == "chain:4":
            assert t.buffers.parents.tolist() == list(range(-1, t.tokens.numel() - 1))
    gen.draft_floor = 0.9  # nothing reaches it: the root alone, after one level of drafting
    levels.clear()
    rootonly = gen.generate(input_ids=PROMPT, max_new_tokens=64, stop_token_ids=set())
    assert rootonly.token_ids == floored.token_ids and {s.tree_size for s in rootonly.steps} == {1}
    assert levels == [] and {s.levels for s in rootonly.steps} == {1}


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_floor_stops_a_dynamic_trees_drafting_and_keeps_the_output(arch, monkeypatch):
    """In a dynamic tree the floor only stops the drafting: a level none of whose frontier nodes
    the draft gives the floor is not drafted, and the best N of the nodes drafted are verified
    (fewer when fewer were drafted). The output is still vanilla's."""
    target = tiny_target(arch)
    gen = EagleGenerator(target, random_head(target), DynamicTreeSpec(top_k=2, depth=3, total_tokens=3))
    levels = counted_levels(monkeypatch)
    vanilla = gen.generate(input_ids=PROMPT, max_new_tokens=64, speculative=False, stop_token_ids=set())
    whole = gen.generate(input_ids=PROMPT, max_new_tokens=64, stop_token_ids=set())
    whole_levels = len(levels)
    assert {s.tree_size for s in whole.steps[:-1]} == {4} and whole_levels == 2 * len(whole.steps)
    gen.draft_floor = 0.02  # a random head: a depth-1 node above it now and then, few deeper
    levels.clear()
    floored = gen.generate(input_ids=PROMPT, max_new_tokens=64, stop_token_ids=set())
    assert_same_or_tie(target, PROMPT, vanilla.token_ids, floored.token_ids)
    assert 0 < len(levels) < whole_levels  # levels below the floor are not drafted
    assert {s.tree_size for s in floored.steps[:-1]} <= {3, 4}  # 2 nodes when only the first level was drafted
    assert sum(s.levels - 1 for s in floored.steps) == len(levels) and {s.levels for s in whole.steps} == {3}
    gen.draft_floor = 0.9  # nothing reaches it: the first level alone, its 2 best nodes verified
    levels.clear()
    first = gen.generate(input_ids=PROMPT, max_new_tokens=64, stop_token_ids=set())
    assert first.token_ids == floored.token_ids and levels == []
    assert {s.tree_size for s in first.steps[:-1]} == {3}


def test_the_floor_is_tuned_for_auto_trees_and_off_for_others():
    target = tiny_target("llama")
    gen = EagleGenerator(target, random_head(target), "chain:3")
    assert gen.floor_for(gen.tree) == 0.0 and gen.floor_for(DynamicTreeSpec()) == 0.0
    gen.draft_floor = 0.1
    assert gen.floor_for(gen.tree) == 0.1 and gen.floor_for(DynamicTreeSpec()) == 0.1
    assert gen._drafter(gen.tree).floor == 0.1
    with pytest.raises(ValueError, match="probability in"):
        gen.draft_floor = 1.0
        gen._drafter(gen.tree)
    with pytest.raises(EagleError, match=r"^draft_floor=2: give a probability in \[0, 1\)"):
        EagleGenerator.from_pretrained(draft_floor=2)  # refused before anything loads


def test_the_drafter_keeps_the_tree_shapes_used_last(monkeypatch):
    """The store of floored or grown shapes drops the least recently used one when full, and a
    store too small for a generation's shapes changes nothing but the time."""
    import eaglespec.draft.drafter as drafter_module

    target = tiny_target("llama")
    gen = EagleGenerator(target, random_head(target), "eagle1")
    gen.draft_floor = 0.02  # a random head: the floor varies the verified shape from step to step
    vanilla = gen.generate(input_ids=PROMPT, max_new_tokens=64, speculative=False, stop_token_ids=set())
    monkeypatch.setattr(drafter_module, "SHAPES_KEPT", 2)
    drafter = gen._drafter(gen.tree)
    drafter._shapes.clear()
    a, b, c = (-1,), (-1, 0), (-1, 0, 0)
    first = drafter._buffers(a)
    drafter._buffers(b)
    assert drafter._buffers(a) is first  # a hit, now the most recent
    drafter._buffers(c)                  # the store is full: b, the least recent, goes
    assert list(drafter._shapes) == [a, c] and drafter._buffers(a) is first
    eagle = gen.generate(input_ids=PROMPT, max_new_tokens=64, stop_token_ids=set())
    assert len({s.tree_size for s in eagle.steps}) >= 3 and len(drafter._shapes) <= 2  # more shapes than kept
    assert_same_or_tie(target, PROMPT, vanilla.token_ids, eagle.token_ids)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("shape", SHAPES)
def test_oracle_drafter_equals_vanilla_and_accepts_all(arch, shape):
    target = tiny_target(arch)
    parents = SHAPES[shape]
    drafter = OracleDrafter(target, PROMPT, parents)
    gen = EagleGenerator(target, drafter=drafter)
    vanilla = gen.generate(input_ids=PROMPT, max_new_tokens=64, speculative=False, stop_token_ids=set())
    eagle = gen.generate(input_ids=PROMPT, max_new_tokens=64, stop_token_ids=set())
    assert_same_or_tie(target, PROMPT, vanilla.token_ids, eagle.token_ids)
    depth = int(drafter and max(len(drafter._ancestors(n)) for n in range(len(parents))))
    # every full step accepts the whole rank-0 path: depth drafts + the bonus token
    assert all(s.accepted == depth for s in eagle.steps[:-1])
    assert eagle.tau > depth


@pytest.mark.parametrize("max_new", [1, 2, 37, 64])
def test_max_length_boundary_mid_tree(max_new):
    target = tiny_target("llama")
    gen = EagleGenerator(target, drafter=OracleDrafter(target, PROMPT, SHAPES["eagle1"]))
    vanilla = gen.generate(input_ids=PROMPT, max_new_tokens=max_new, speculative=False, stop_token_ids=set())
    eagle = gen.generate(input_ids=PROMPT, max_new_tokens=max_new, stop_token_ids=set())
    assert len(eagle.token_ids) == max_new
    assert eagle.token_ids == vanilla.token_ids
    assert eagle.finish_reason == vanilla.finish_reason == "length"
    assert sum(s.emitted for s in eagle.steps) == max_new - 1  # the prefill's token is not a step


@pytest.mark.parametrize("tree", ["oracle", "eagle1", "dynamic"])
def test_eos_mid_tree(tree):
    target = tiny_target("qwen2", seed=1)
    full = EagleGenerator(target).generate(input_ids=PROMPT, max_new_tokens=64, speculative=False, stop_token_ids=set())
    # pick a stop token first produced well inside the output, so the stop falls mid-step
    stop = next(t for i, t in enumerate(full.token_ids) if i >= 12 and t not in full.token_ids[:i])
    if tree == "oracle":
        gen = EagleGenerator(target, drafter=OracleDrafter(target, PROMPT, SHAPES["eagle1"]))
    else:
        gen = EagleGenerator(target, random_head(target), tree)
    vanilla = gen.generate(input_ids=PROMPT, max_new_tokens=64, speculative=False, stop_token_ids={stop})
    eagle = gen.generate(input_ids=PROMPT, max_new_tokens=64, stop_token_ids={stop})
    assert vanilla.token_ids[-1] == stop and vanilla.finish_reason == "stop"
    assert eagle.token_ids == vanilla.token_ids
    assert eagle.finish_reason == "stop"
    outputs = list(gen.stream(PROMPT, 64, stop_token_ids={stop}))  # only the last output says why it ends
    assert [o.finish_reason for o in outputs] == [None] * (len(outputs) - 1) + ["stop"]


def test_dynamic_tree_respects_total_tokens():
    target = tiny_target("llama")
    spec = DynamicTreeSpec(top_k=3, depth=4, total_tokens=7)
    gen = EagleGenerator(target, random_head(target), spec)
    out = gen.generate(input_ids=PROMPT, max_new_tokens=20, stop_token_ids=set())
    assert all(s.tree_size == 8 for s in out.steps[:-1])


def test_sampling_is_reproducible_and_vanilla_matches_distribution_support():
    target = tiny_target("llama")
    gen = EagleGenerator(target, random_head(target), "eagle1")
    a = gen.generate(input_ids=PROMPT, max_new_tokens=30, temperature=0.8, top_p=0.9, seed=3, stop_token_ids=set())
    b = gen.generate(input_ids=PROMPT, max_new_tokens=30, temperature=0.8, top_p=0.9, seed=3, stop_token_ids=set())
    assert a.token_ids == b.token_ids and len(a.token_ids) == 30


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(temperature=-1.0), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
])
def test_bad_generation_arguments(kwargs, message):
    target = tiny_target("llama", check=False)
    with pytest.raises(EagleError, match=message):
        EagleGenerator(target).generate(input_ids=PROMPT, **kwargs)


def test_prompt_longer_than_context():
    target = tiny_target("llama", check=False)
    with pytest.raises(EagleError, match="context"):
        EagleGenerator(target).generate(input_ids=[3] * 600)


def test_reduced_draft_vocab_round_trip_and_greedy_equality(tmp_path):
    from eaglespec.draft.drafter import Drafter
    from eaglespec.draft.vocab import load_draft_vocab, save_draft_vocab

    target = tiny_target("llama")
    counts = torch.arange(128) % 50  # ties broken by token id (stable sort)
    save_draft_vocab(tmp_path, counts)
    d2t = load_draft_vocab(tmp_path, 16, 128)
    expected = sorted(range(128), key=lambda t: (-(t % 50), t))[:16]
    assert d2t.tolist() == expected
    assert load_draft_vocab(tmp_path, 128, 128) is None  # the whole vocabulary: no mapping
    with pytest.raises(EagleError, match="another target"):
        load_draft_vocab(tmp_path, 16, 256)

    head = random_head(target)
    drafter = Drafter(head, target, parse_tree("eagle1"), d2t, context_vocab=False)
    state = drafter.new_state()
    feats = target.forward(torch.tensor([PROMPT]), target.new_cache())[0]
    tree = drafter.draft(state, torch.tensor(PROMPT[1:] + [7]), feats, root=7)
    assert set(tree.tokens[1:].tolist()) <= set(expected)  # draft ids map back to target ids

    gen = EagleGenerator(target, head, "eagle1", draft_vocab=d2t)
    vanilla = gen.generate(input_ids=PROMPT, max_new_tokens=48, speculative=False, stop_token_ids=set())
    eagle = gen.generate(input_ids=PROMPT, max_new_tokens=48, stop_token_ids=set())
    assert_same_or_tie(target, PROMPT, vanilla.token_ids, eagle.token_ids)


def context_drafter(target, head, tree="eagle1", size=16):
    """A drafter over the `size` lowest ids (a reduced vocabulary PROMPT mostly leaves out)."""
    from eaglespec.draft.drafter import Drafter

    return Drafter(head, target, parse_tree(tree), torch.arange(size))


def test_the_context_vocabulary_scores_the_rows_own_tokens_renormalised():
    """A reduced draft vocabulary also scores each row's context tokens outside it: q over the
    union is the softmax of the target LM head's rows for the vocabulary then the context tokens
    (in order of first appearance), each row with its own."""
    target = tiny_target("llama")
    head = random_head(target)
    drafter = context_drafter(target, head)
    prompts = [PROMPT, [40, 41, 5, 40, 99]]
    state = drafter.new_state(2)
    feats = [target.forward(torch.tensor([p]), target.new_cache())[0] for p in prompts]
    drafter.draft_rows(state, [torch.tensor(p[1:] + [7]) for p in prompts], feats, [7, 7])
    extras = [[t for t in dict.fromkeys(p[1:] + [7]) if t >= 16] for p in prompts]
    assert [c.ids for c in state.context] == extras
    out = torch.randn(2, 3, target.config.hidden_size, dtype=target.dtype)
    q, table = drafter._draft_logprobs(state, out)
    w = target.lm_head.weight
    for r in range(2):
        ids = list(range(16)) + extras[r]
        ref = torch.log_softmax((out[r] @ w[ids].T).float(), dim=-1)
        assert table[r, : len(ids)].tolist() == ids
        assert torch.allclose(q[r, :, : len(ids)], ref, atol=1e-6)
        assert torch.isinf(q[r, :, len(ids):]).all()  # the shorter row's padding is never drafted
    from eaglespec.core.noise import DraftNoise, perturbed_logprobs

    noise = [DraftNoise(5, 40, 1.0), DraftNoise(6, 12, 0.7)]  # each row ranks with the noise of its own target ids
    ranked = drafter._ranked(q, noise, 1, table)
    for r in range(2):
        n = 16 + len(extras[r])
        want = perturbed_logprobs(q[r, :, :n], noise[r], 1, table[r, :n])
        assert torch.allclose(ranked[r, :, :n], want.to(ranked.dtype), atol=1e-6)
    state.select([1])
    assert [c.ids for c in state.context] == extras[1:]
    q1, table1 = drafter._draft_logprobs(state, out[1:])  # a lone row: its own rows, no padding
    ids = list(range(16)) + extras[1]
    assert table1[0].tolist() == ids and torch.allclose(q1[0], q[1, :, : len(ids)], atol=1e-6)
    off = context_drafter(target, head)
    off.context_vocab = False
    q0, table0 = off._draft_logprobs(state, out[1:])
    assert table0 is None and q0.shape[-1] == 16


@pytest.mark.parametrize("tree", ["eagle1", "dynamic:3,4,10"])
def test_context_tokens_are_drafted_and_the_output_stays_vanillas(tree, monkeypatch):
    """A random head's drafts include context tokens outside the vocabulary, never a token from
    neither, and the output is vanilla's, greedy and in reproducible sampling."""
    from eaglespec.draft.drafter import Drafter

    target = tiny_target("llama")
    head = random_head(target)
    drafted = []
    grow = Drafter.draft_rows
    monkeypatch.setattr(Drafter, "draft_rows", lambda self, *a, **k: [drafted.extend(t.tokens[1:].tolist()) or t
                                                                        for t in grow(self, *a, **k)])
    gen = EagleGenerator(target, head, tree, draft_vocab=torch.arange(16))
    context = set(PROMPT)
    for kwargs in ({}, {"seed": 3, "temperature": 1.0}):
        vanilla = gen.generate(input_ids=PROMPT, max_new_tokens=40, speculative=False, stop_token_ids=set(), **kwargs)
        context |= set(vanilla.token_ids)
        eagle = gen.generate(input_ids=PROMPT, max_new_tokens=40, stop_token_ids=set(), **kwargs)
        if kwargs:
            assert vanilla.token_ids == eagle.token_ids
        else:
            assert_same_or_tie(target, PROMPT, vanilla.token_ids, eagle.token_ids)
    assert any(t >= 16 for t in drafted) and all(t < 16 or t in context for t in drafted)
