"""The adapter: tree forward equals per-branch causal forward; bad models are refused."""

import pytest
import torch
from conftest import ARCHS, tiny_config, tiny_target

from eaglespec.core.tree import buffers_from_parents
from eaglespec.engine.kv_cache import keep_path, new_cache
from eaglespec.engine.target import TargetModel, resolve_target
from eaglespec.errors import EagleError

PARENTS = [-1, 0, 0, 1, 1, 2, 3]  # root with two branches of depth 3 and 2


def prefix_then_tree(target, seed: int, prefix_len: int):
    """Random prefix in the cache, then the PARENTS tree on top: -> (prefix, tokens, buffers, cache, features)."""
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(3, 128, (1, prefix_len), generator=g)
    tokens = torch.randint(3, 128, (len(PARENTS),), generator=g)
    b = buffers_from_parents(torch.tensor(PARENTS))
    cache = target.new_cache()
    target.forward(prefix, cache)
    features = target.forward(tokens[None], cache, b.tree_mask, b.tree_position_ids)
    return prefix, tokens, b, cache, features


@pytest.mark.parametrize("arch", ARCHS)
def test_tree_forward_equals_per_branch_forward(arch):
    target = tiny_target(arch)
    prefix, tokens, b, _, features = prefix_then_tree(target, seed=0, prefix_len=9)
    tree_logits = target.logits(features)[0]
    for row in b.retrieve_indices:
        path = row[row >= 0]
        seq = torch.cat([prefix[0], tokens[path]])[None]
        ref = target.model(seq).logits[0, -len(path):]
        torch.testing.assert_close(tree_logits[path], ref.float(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "mixtral"])
def test_cache_after_acceptance_equals_fresh_prefill(arch):
    target = tiny_target(arch)
    prefix, tokens, _, cache, _ = prefix_then_tree(target, seed=1, prefix_len=7)
    path = torch.tensor([0, 2, 5])  # a non-contiguous accepted path
    keep_path(cache, prefix.shape[1], path)

    fresh = target.new_cache()
    target.forward(torch.cat([prefix[0], tokens[path]])[None], fresh)
    assert cache.get_seq_length() == fresh.get_seq_length() == 10
    for ours, ref in zip(cache.layers, fresh.layers):
        torch.testing.assert_close(ours.keys, ref.keys)
        torch.testing.assert_close(ours.values, ref.values)
    # and the next token sees the same context
    nxt = torch.tensor([[42]])
    torch.testing.assert_close(target.forward(nxt, cache), target.forward(nxt, fresh))


def test_a_model_that_ignores_tree_masks_is_refused():
    class MaskIgnoring(TargetModel):
        def forward(self, input_ids, cache, tree_mask=None, tree_position_ids=None):
            return super().forward(input_ids, cache)  # plain causal: siblings would see each other

    target = tiny_target("llama", check=False)
    broken = MaskIgnoring(target.model, None, "broken")
    with pytest.raises(EagleError, match="tree forward differs"):
        broken.check_tree_forward()


def test_sliding_window_cache_is_refused():
    cfg = tiny_config("mistral")
    cfg.sliding_window = 16
    with pytest.raises(EagleError, match="sliding-window"):
        new_cache(cfg)


def test_unknown_target_path_is_a_clear_error(tmp_path):
    with pytest.raises(EagleError, match="not found"):
        resolve_target(str(tmp_path / "nope"))
    with pytest.raises(EagleError, match="config.json"):
        resolve_target(str(tmp_path))


def test_fingerprint_is_the_same_in_every_dtype_and_tells_weights_apart():
    prints = {dtype: tiny_target("qwen2", dtype=dtype, check=False).fingerprint()
              for dtype in (torch.float64, torch.float32, torch.bfloat16, torch.float16)}
    assert len(set(prints.values())) == 1, prints
    assert tiny_target("qwen2", seed=1, check=False).fingerprint() != prints[torch.float64]
    tuned = tiny_target("qwen2", check=False)  # a LoRA-sized change to one attention matrix of layer 0
    with torch.no_grad():
        q = tuned.decoder.layers[0].self_attn.q_proj.weight
        q += 2e-3 * torch.randn(q.shape, generator=torch.Generator().manual_seed(0), dtype=q.dtype)
    assert tuned.fingerprint() != prints[torch.float64]
    assert prints[torch.float64].startswith("v2-")
