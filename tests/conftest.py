"""Shared fixtures: tiny random-weight HF models of several architectures, built in-process."""

import contextlib
import os
import threading
import time

import pytest
import torch

# Eager decoding unless a test asks for the compiled step (compiling takes seconds on tiny models,
# minutes on the real one): set for the whole session, so module-scoped fixtures see it too.
os.environ["EAGLESPEC_COMPILE"] = "off"

from eaglespec.engine.target import TargetModel

ARCHS = ("llama", "qwen2", "qwen3", "mistral", "mixtral")


def pytest_collection_modifyitems(config, items):
    """`TEST_WORKERS=2 make test` runs two pytest-xdist workers with --dist loadgroup: each test
    file stays in one worker, in order (module fixtures and order-dependent checks as in a plain
    run), and the real-model tests (marked slow) all run in one worker, one after another. (Opt-in:
    on CI's two cores the real-model group, using both cores, made it no faster than one process.)"""
    for item in items:
        group = "real-model" if item.get_closest_marker("slow") else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))


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


@contextlib.contextmanager
def paused_for_a_while(folder, work: list, monkeypatch, seconds: float = 0.4):
    """A PAUSE file in `folder` for `seconds`, then removed, while the body runs a long job there
    -> an Event, set if `work` (what the job appends to as it works) was still empty when the file went."""
    import eaglespec.pause as pause

    monkeypatch.setattr(pause, "POLL_S", 0.05)
    (folder / pause.PAUSE_FILE).touch()
    seen_paused = threading.Event()

    def resume_later():
        time.sleep(seconds)
        if not work:  # nothing was done while the file was there
            seen_paused.set()
        (folder / pause.PAUSE_FILE).unlink()

    thread = threading.Thread(target=resume_later)
    thread.start()
    try:
        yield seen_paused
    finally:
        thread.join()


@torch.no_grad()
def second_token_marginal(target, prompt: list[int]) -> torch.Tensor:
    """The target's distribution of the second generated token at temperature 1:
    sum_a p(a | prompt) p(b | prompt, a), exact over every first token a. -> [V]"""
    from eaglespec.core.sampling import logits_to_probs

    first = logits_to_probs(target.model(torch.tensor([prompt])).logits[0, -1], 1.0)
    support = first.nonzero().flatten()
    batch = torch.cat([torch.tensor(prompt).expand(len(support), -1), support[:, None]], 1)
    second = logits_to_probs(target.model(batch).logits[:, -1], 1.0)  # [A, V]
    return (first[support, None] * second).sum(0)


@pytest.fixture(scope="session", autouse=True)
def _session_cache(tmp_path_factory):
    """The cache folders of module- and session-scoped fixtures (set up before any test's own
    folders below, e.g. tests/test_real_model.py's generator): one fresh cache for the session,
    and the session's one folder of dequantized GGUF copies (the first load writes it), never the
    user's cache; llama.cpp's build stays where the user's cache has it (tests/interop use it)."""
    from eaglespec.interop import build_llamacpp

    base = tmp_path_factory.getbasetemp()
    chosen = {build_llamacpp.ROOT_ENV: build_llamacpp.default_root(),  # before the cache moves
              "EAGLESPEC_CACHE": base / "eaglespec-session-cache", "EAGLESPEC_GGUF_COPIES": base / "gguf-copies"}
    old = {name: os.environ.get(name) for name in chosen}
    os.environ.update({name: str(path) for name, path in chosen.items()})
    yield
    for name, value in old.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(autouse=True)
def _cache_in_a_temporary_folder(_session_cache, tmp_path_factory, monkeypatch):
    """Measured cost curves (files.cache_dir) go to a fresh folder per test (the session's folders
    above stay for the rest: GGUF copies, llama.cpp's build), no test inherits a retune request
    from the shell, and decoding is eager unless a test asks for the compiled step (compiling
    takes seconds to minutes)."""
    monkeypatch.setenv("EAGLESPEC_CACHE", str(tmp_path_factory.mktemp("eaglespec-cache")))
    monkeypatch.delenv("EAGLESPEC_RETUNE", raising=False)
    monkeypatch.setenv("EAGLESPEC_COMPILE", "off")  # eager unless a test asks for the compiled path


@pytest.fixture(autouse=True)
def _no_load_reading(monkeypatch):
    """The cost curve's check for other processes' CPU time (tuning._cpu_seconds) reads nothing in
    tests: a fake measurement takes microseconds, over which one clock tick of whatever else runs
    reads as a thousand cores, and a real one beside other work would be measured again. The tests
    of the check itself give it readings of their own."""
    from eaglespec.engine import tuning

    monkeypatch.setattr(tuning, "_cpu_seconds", lambda: None)


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


@pytest.fixture
def one_cache_length(monkeypatch):
    """Batch invariance (numerics.measure_invariance, and numerics_for's cache key with it) after
    one cache length instead of CONTEXT_OFFSETS' eight: the eight are there for bf16 siblings (which
    round otherwise at some lengths on the Intel AMX kind) and are tested in test_numerics; a
    float32 real-model test that measures the gate spends a third of its time there."""
    from eaglespec.engine import numerics

    monkeypatch.setattr(numerics, "CONTEXT_OFFSETS", numerics.CONTEXT_OFFSETS[:1])


@pytest.fixture(params=ARCHS)
def any_arch_target(request):
    return tiny_target(request.param)


@pytest.fixture
def llama_target():
    return tiny_target("llama")
