"""EAGLE-3 heads: the forward against plain math, training-time test against the drafter's own
step-by-step unrolling, the draft-vocabulary tables, lossless generation, and bad head files."""

import json
import math

import pytest
import torch
from conftest import ARCHS, second_token_marginal, tiny_target
from safetensors.torch import load_file, save_file
from test_decoding import PROMPT, assert_same_or_tie
from test_verify import chi_square_fits

from eaglespec.core.attention import additive_mask
from eaglespec.draft.eagle3 import Eagle3Config, Eagle3Head
from eaglespec.draft.heads import inspect_head, load_head
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.errors import EagleError

DRAFT_VOCAB = 48


def eagle3_head(target, seed=1, draft_vocab=DRAFT_VOCAB, layer_ids=None) -> Eagle3Head:
    torch.manual_seed(seed)
    head = Eagle3Head(Eagle3Config.for_target(target.config, draft_vocab, layer_ids))
    head.set_draft_vocab(torch.randperm(target.vocab_size)[:draft_vocab])
    with torch.no_grad():  # random init is near-uniform: make the draft opinionated
        head.lm_head.weight.mul_(20.0)
    return head.to(target.dtype)


# ---- the forward, against plain math --------------------------------------------------------
def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, positions, theta):
    """x [heads, T, d] rotated by positions [T] (the rotate-half convention)."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = positions[:, None].double() * inv[None]
    cos, sin = torch.cat([ang, ang], -1).cos().to(x.dtype), torch.cat([ang, ang], -1).sin().to(x.dtype)
    half = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos + half * sin


def reference_forward(head: Eagle3Head, embeds, hidden):
    """One sequence, causal, no cache: embeds, hidden [T, H] -> (o [T, H], draft logits [T, Vd])."""
    c, m, sd = head.config, head.midlayer, head.state_dict()
    eps = c.rms_norm_eps
    t = hidden.shape[0]
    u = torch.cat([rms(embeds, sd["midlayer.input_layernorm.weight"], eps),
                   rms(hidden, sd["midlayer.hidden_norm.weight"], eps)], -1)
    positions = torch.arange(t)

    def heads(w, n):
        return (u @ w.T).view(t, n, c.head_dim).transpose(0, 1)  # [n, T, d]

    q = rope(heads(sd["midlayer.self_attn.q_proj.weight"], c.num_attention_heads), positions, c.rope_theta)
    k = rope(heads(sd["midlayer.self_attn.k_proj.weight"], c.num_key_value_heads), positions, c.rope_theta)
    v = heads(sd["midlayer.self_attn.v_proj.weight"], c.num_key_value_heads)
    group = c.num_attention_heads // c.num_key_value_heads
    k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
    scores = q @ k.transpose(1, 2) / math.sqrt(c.head_dim)
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    attn = (scores.softmax(-1) @ v).transpose(0, 1).reshape(t, -1)
    h = hidden + attn @ sd["midlayer.self_attn.o_proj.weight"].T
    x = rms(h, sd["midlayer.post_attention_layernorm.weight"], eps)
    mlp = (torch.nn.functional.silu(x @ sd["midlayer.mlp.gate_proj.weight"].T) * (x @ sd["midlayer.mlp.up_proj.weight"].T))
    o = h + mlp @ sd["midlayer.mlp.down_proj.weight"].T
    return o, rms(o, sd["norm.weight"], eps) @ sd["lm_head.weight"].T


@pytest.mark.parametrize("arch", ARCHS)
def test_forward_matches_plain_math(arch):
    target = tiny_target(arch)
    head = eagle3_head(target)
    ids = torch.tensor([PROMPT])
    states = target.forward_states(ids, target.new_cache(), layers=head.hidden_layers)
    hidden = head.encode(states.hidden)  # [1, T, H]
    fused = torch.cat([target.model(ids, output_hidden_states=True).hidden_states[i] for i in head.hidden_layers], -1)
    torch.testing.assert_close(hidden[0], fused[0] @ head.fc.weight.T)
    embeds = target.embed_tokens(ids)
    out = head(embeds, hidden)
    o, logits = reference_forward(head, embeds[0], hidden[0])
    torch.testing.assert_close(out[0], o)
    lm = head.draft_lm(target)
    torch.testing.assert_close(lm.logprobs(out[0]), logits.log_softmax(-1).float())
    # a cached forward in two pieces equals the one-shot forward
    from transformers import DynamicCache

    cache = DynamicCache(config=head.cache_config)
    first = head(embeds[:, :6], hidden[:, :6], cache=cache)
    second = head(embeds[:, 6:], hidden[:, 6:], cache=cache)
    torch.testing.assert_close(torch.cat([first, second], 1), out)


def test_layer_ids_follow_vllm_indexing():
    target = tiny_target("llama")
    ids = torch.tensor([PROMPT])
    states = target.forward_states(ids, target.new_cache(), layers=(0, 1, 0))
    h = target.hidden_size
    torch.testing.assert_close(states.hidden[0, :, :h], target.embed_tokens(ids)[0])  # 0 = the embeddings
    layer0 = target.decoder.layers[0]
    captured = {}
    hook = layer0.register_forward_hook(lambda mod, args, out: captured.setdefault("out", out))
    target.features(ids)
    hook.remove()
    out = captured["out"][0] if isinstance(captured["out"], tuple) else captured["out"]
    torch.testing.assert_close(states.hidden[0, :, h:2 * h], out[0])  # 1 = what layer 0 wrote


# ---- training-time test -----------------------------------------------------------------------
def unrolled_reference(head, embeds, hidden, tokens_embed, steps):
    """The drafter's view, one context end at a time: real pairs 0..t in a cache, then a chain of
    drafted nodes, each at position t+j, seeing the real pairs, its ancestors and itself."""
    from transformers import DynamicCache

    t_len = hidden.shape[1]
    outs = torch.zeros(steps, t_len, hidden.shape[-1], dtype=hidden.dtype)
    for t in range(t_len):
        cache = DynamicCache(config=head.cache_config)
        o = head(embeds[:, : t + 1], hidden[:, : t + 1], cache=cache)[:, -1:]
        outs[0, t] = o[0, 0]
        for j in range(1, steps):
            if t + j >= t_len:
                break
            past = t + j  # t+1 real pairs and j-1 drafted ancestors
            allowed = torch.ones(1, past + 1, dtype=torch.bool)
            o = head(tokens_embed[:, t + j: t + j + 1], o, attention_mask=additive_mask(allowed, hidden.dtype),
                     position_ids=torch.tensor([[t + j]]), cache=cache)
            outs[j, t] = o[0, 0]
    return outs


def test_training_time_test_equals_the_unrolled_drafter():
    target = tiny_target("qwen3")
    head = eagle3_head(target)
    ids = torch.tensor([PROMPT + [40, 41, 42]])
    t_len, steps = ids.shape[1] - 1, 4
    hidden = head.encode(target.capture_states(ids, layers=head.hidden_layers).hidden[:, :-1])  # [1, T, H]
    embeds = target.embed_tokens(ids[:, 1:])  # embed(x[t+1])
    reference = unrolled_reference(head, embeds, hidden, embeds, steps)
    keys, values, h = [], [], hidden
    for j in range(steps):
        # step j at column t reads x[t+1+j]: shift the tokens left (the tail is padding, never read)
        e = torch.cat([embeds[:, j:], embeds[:, :j]], 1)
        positions = torch.arange(j, t_len + j)[None]
        h = head.ttt_step(e, h, positions, keys, values)
        valid = t_len - j
        torch.testing.assert_close(h[0, :valid], reference[j, :valid], msg=f"step {j}")


def test_ttt_masks_can_fail():
    """A step that sees its siblings' (later columns') drafted keys is not what the drafter does."""
    target = tiny_target("llama")
    head = eagle3_head(target)
    ids = torch.tensor([PROMPT])
    hidden = head.encode(target.capture_states(ids, layers=head.hidden_layers).hidden[:, :-1])
    embeds = target.embed_tokens(ids[:, 1:])
    reference = unrolled_reference(head, embeds, hidden, embeds, 2)
    keys, values = [], []
    h = head.ttt_step(embeds, hidden, torch.arange(hidden.shape[1])[None], keys, values)
    e = torch.cat([embeds[:, 1:], embeds[:, :1]], 1)
    wrong = head(e, h, position_ids=torch.arange(1, hidden.shape[1] + 1)[None])  # plain causal over drafts
    assert not torch.allclose(wrong[0, :-1], reference[1, :-1])


# ---- the draft vocabulary ------------------------------------------------------------------
def test_d2t_t2d_round_trip(tmp_path):
    target = tiny_target("llama")
    head = eagle3_head(target)
    chosen = torch.tensor(sorted(torch.randperm(target.vocab_size, generator=torch.Generator().manual_seed(5))[:DRAFT_VOCAB].tolist()))
    head.set_draft_vocab(chosen[torch.randperm(DRAFT_VOCAB)])
    assert torch.equal(head.target_ids(), chosen)
    assert torch.equal(head.t2d.nonzero().flatten(), chosen)
    assert (head.d2t >= 0).all()  # offsets of ascending ids
    head.save_pretrained(tmp_path)
    again = load_head(tmp_path, target.config).to(target.dtype)
    assert again.kind == "eagle3" and torch.equal(again.target_ids(), chosen)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == DRAFT_VOCAB
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == list(head.hidden_layers)
    x = torch.randn(1, 5, target.hidden_size, dtype=target.dtype)
    torch.testing.assert_close(again(x, x), head(x, x))
    ids = again.draft_lm(target).to_target_ids(torch.arange(DRAFT_VOCAB))
    assert torch.equal(ids, chosen)


# ---- lossless generation -------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tree", ["eagle1", "chain:3", "dynamic:3,4,10"])
def test_greedy_eagle3_equals_vanilla(arch, tree):
    target = tiny_target(arch)
    gen = EagleGenerator(target, eagle3_head(target), tree)
    vanilla = gen.generate(input_ids=PROMPT, max_new_tokens=48, speculative=False, stop_token_ids=set())
    eagle = gen.generate(input_ids=PROMPT, max_new_tokens=48, stop_token_ids=set())
    assert len(vanilla.token_ids) == 48
    assert_same_or_tie(target, PROMPT, vanilla.token_ids, eagle.token_ids)
    assert all(s.tree_size > 1 for s in eagle.steps[:-1])


def test_greedy_eagle3_accepts_when_it_drafts_well():
    """A head whose drafts follow the target (distilled in a few steps) gets accepted, and the
    output stays vanilla's: the acceptance path, not only the rejection path, is exercised."""
    target = tiny_target("llama")
    head = eagle3_head(target, draft_vocab=target.vocab_size)
    gen = EagleGenerator(target, head, "chain:2")
    vanilla = gen.generate(input_ids=PROMPT, max_new_tokens=40, speculative=False, stop_token_ids=set())
    ids = torch.tensor([PROMPT + vanilla.token_ids])
    states = target.capture_states(ids, layers=head.hidden_layers)
    wanted = target.logits(states.features)[0, 1:].argmax(-1)  # x[t+2] at column t
    opt = torch.optim.Adam(head.parameters(), lr=3e-3)
    for _ in range(150):
        out = head(target.embed_tokens(ids[:, 1:]), head.encode(states.hidden[:, :-1]))
        loss = torch.nn.functional.cross_entropy(head.draft_lm(target).logprobs(out[0]), wanted)
        opt.zero_grad()
        loss.backward()
        opt.step()
    head.zero_grad(set_to_none=True)
    eagle = gen.generate(input_ids=PROMPT, max_new_tokens=40, stop_token_ids=set())
    assert eagle.token_ids == vanilla.token_ids
    assert sum(s.accepted for s in eagle.steps) > 0


def test_sampling_with_eagle3_keeps_the_target_distribution():
    """The second emitted token (the first verified one) follows the target's marginal
    sum_a p(a | prompt) p(b | prompt, a), computed exactly over every first token a."""
    target = tiny_target("llama")
    with torch.no_grad():
        target.lm_head.weight.div_(4.0)  # soften the test models' sharpening: p spreads over many tokens
    gen = EagleGenerator(target, eagle3_head(target), "dynamic:3,2,4")
    counts = torch.zeros(target.vocab_size)
    for seed in range(1500):
        out = gen.generate(input_ids=PROMPT, max_new_tokens=2, temperature=1.0, seed=seed, stop_token_ids=set(),
                           sampling_mode="speculative")
        counts[out.token_ids[1]] += 1
    ok, stat, critical = chi_square_fits(counts, second_token_marginal(target, PROMPT))
    assert ok, f"chi2 {stat:.1f} > {critical:.1f}"


# ---- bad head files ------------------------------------------------------------------------
def _saved(tmp_path, target, **change):
    head = eagle3_head(target)
    head.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.update(change)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def _edit_tensors(path, fn):
    sd = load_file(path / "model.safetensors")
    fn(sd)
    save_file(sd, path / "model.safetensors")


@pytest.mark.parametrize("case, message", [
    ("layers", "layer ids"),
    ("d2t_length", "d2t table has"),
    ("d2t_range", "outside the target vocabulary"),
    ("hidden", "hidden_size"),
    ("missing", "missing tensors"),
    ("neither", "neither an EAGLE-1 head"),
    ("mismatch", "intermediate_size is 100 but the weights have 128 .* config.json and the weights disagree"),
    ("draft_vocab", "draft_vocab_size is 40 but the weights have 48"),
    ("attention", "num_attention_heads x head_dim is 128 but the weights have 64"),
    ("d2t_twice", "same target token"),
    ("variant", "norm_before_residual"),
])
def test_bad_eagle3_heads_are_refused(tmp_path, case, message):
    target = tiny_target("llama")
    if case == "layers":
        _saved(tmp_path, target, eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 7]})
    elif case == "hidden":
        _saved(tmp_path, target, target_hidden_size=32)
    elif case == "neither":
        _saved(tmp_path, target, architectures=["BertModel"], num_hidden_layers=12, draft_vocab_size=None,
               eagle_config=None)
        cfg = json.loads((tmp_path / "config.json").read_text())
        del cfg["draft_vocab_size"], cfg["eagle_config"]
        (tmp_path / "config.json").write_text(json.dumps(cfg))
    elif case == "mismatch":
        _saved(tmp_path, target, intermediate_size=100)
    elif case == "draft_vocab":
        _saved(tmp_path, target, draft_vocab_size=40)
    elif case == "attention":
        _saved(tmp_path, target, num_attention_heads=8)
    elif case == "variant":
        _saved(tmp_path, target, norm_before_residual=True)
    else:
        _saved(tmp_path, target)
        edits = {
            "d2t_length": lambda sd: sd.update(d2t=sd["d2t"][:-3]),
            "d2t_range": lambda sd: sd.update(d2t=sd["d2t"] + target.vocab_size),
            "missing": lambda sd: sd.pop("midlayer.hidden_norm.weight"),
            "d2t_twice": lambda sd: sd.update(d2t=torch.cat([sd["d2t"][:1] + 1, sd["d2t"][1:]])),
        }
        _edit_tensors(tmp_path, edits[case])
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(EagleError, match=message) as info:
        load_head(tmp_path, target.config)
    assert "\n" not in str(info.value)
    if case in ("mismatch", "draft_vocab", "attention", "neither"):  # the head's own files: found before a target loads
        with pytest.raises(EagleError, match=message):
            inspect_head(tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_sharded_heads_load_like_one_file(tmp_path):
    """Hugging Face's sharded layout (a device's files come back at most 16 MB each)."""
    target = tiny_target("llama")
    head = eagle3_head(target)
    head.save_pretrained(tmp_path / "one")
    head.save_pretrained(tmp_path / "sharded", max_shard_bytes=60_000)
    shards = sorted(p.name for p in (tmp_path / "sharded").glob("model-*.safetensors"))
    assert len(shards) > 1 and (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    a, b = load_head(tmp_path / "one", target.config), load_head(tmp_path / "sharded", target.config)
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())
    (tmp_path / "sharded" / shards[-1]).unlink()
    with pytest.raises(EagleError, match=shards[-1]):
        load_head(tmp_path / "sharded", target.config)


def test_heads_written_elsewhere_load_too(tmp_path):
    """d2t without t2d (derived), RoPE scaling given as transformers 5's rope_parameters."""
    target = tiny_target("llama")
    head = eagle3_head(target)
    head.save_pretrained(tmp_path)
    _edit_tensors(tmp_path, lambda sd: sd.pop("t2d"))
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.pop("rope_theta")
    cfg["rope_parameters"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    again = load_head(tmp_path, target.config)
    assert torch.equal(again.t2d, head.t2d)
    assert again.config.rope_theta == 5000.0 and again.config.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    assert again.rotary.attention_scaling == 1.0 and again.rotary.rope_type == "linear"


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_drafters_chain_is_what_training_time_test_scores(arch):
    """End to end through the real Drafter: draft a chain after a prompt, append the drafted
    tokens to the sequence, and training-time test's step k at the prompt's last column must pick
    the same draft token as the drafter did at depth k+1."""
    from eaglespec.core.config import parse_tree
    from eaglespec.draft.drafter import Drafter

    target = tiny_target(arch)
    head = eagle3_head(target, seed=3)
    prompt = torch.tensor(PROMPT)
    states = target.forward_states(prompt[None], target.new_cache(), layers=head.hidden_layers)
    root = int(target.logits(states.features[0, -1]).argmax())
    drafter = Drafter(head, target, parse_tree("chain:4"))
    tree = drafter.draft(drafter.new_state(), torch.cat([prompt[1:], torch.tensor([root])]), states.hidden[0], root)
    drafted = tree.tokens.tolist()  # [root, d1, d2, d3, d4]
    seq = torch.tensor(PROMPT + drafted)
    hidden = head.encode(target.capture_states(seq[None], layers=head.hidden_layers).hidden[:, :-1])
    embeds = target.embed_tokens(seq[None, 1:])
    t = len(PROMPT) - 1  # the root pair's column: (x[t+1] = root, a[t])
    keys, values, h = [], [], hidden
    lm = head.draft_lm(target)
    for k in range(4):
        e = torch.cat([embeds[:, k:], embeds[:, :k]], 1)
        h = head.ttt_step(e, h, torch.arange(k, embeds.shape[1] + k)[None], keys, values)
        pick = int(lm.to_target_ids(lm.logprobs(h[0, t:t + 1]).argmax(-1)))
        assert pick == drafted[k + 1], f"depth {k + 1}"
