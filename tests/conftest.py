"""Shared fixtures: tiny random-weight HF models of several architectures, built in-process."""

import pytest
import torch

from eaglespec.target import TargetModel

ARCHS = ("llama", "qwen2", "qwen3", "mistral", "mixtral")


def tiny_config(arch: str, vocab_size: int = 128, hidden_size: int = 64):
    from transformers import AutoConfig

    common = dict(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=hidden_size // 4,
        max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    if arch in ("mistral", "mixtral", "qwen2", "qwen3"):
        common["sliding_window"] = None
    if arch == "mixtral":
        common.update(num_local_experts=4, num_experts_per_tok=2)
    return AutoConfig.for_model(arch, **common)


def tiny_model(arch: str = "llama", seed: int = 0, dtype=torch.float64, **kwargs):
    """A random-weight causal LM. float64 by default, so that kernel rounding (q=1 vs. q>1) cannot
    flip an argmax in greedy-equality tests."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_config(arch, **kwargs)
    cfg._attn_implementation = "sdpa"
    if arch == "mixtral":
        cfg._experts_implementation = "eager"  # grouped_mm has no float64 kernel
    model = AutoModelForCausalLM.from_config(cfg).to(dtype)
    # Random init gives near-uniform logits; sharpen them so that greedy paths are decisive.
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    return model.eval()


def tiny_target(arch: str = "llama", seed: int = 0, dtype=torch.float64, check: bool = True, **kwargs) -> TargetModel:
    target = TargetModel(tiny_model(arch, seed, dtype, **kwargs), tokenizer=None, name=f"tiny-{arch}")
    if check:
        target.check_tree_forward()
    return target


@pytest.fixture(autouse=True)
def _one_thread_for_tiny_models(request):
    """Tiny models run faster on one thread (and CI's 2 cores may be shared); the real-model
    tests (marked slow) keep torch's default."""
    if request.node.get_closest_marker("slow"):
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(params=ARCHS)
def any_arch_target(request):
    return tiny_target(request.param)


@pytest.fixture
def llama_target():
    return tiny_target("llama")
