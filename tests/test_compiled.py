"""The compiled decoding step (compiled.py): the same ids as eager on five families, logits within
fp32 tolerance, no recompilation while decoding, batches equal to each sequence alone, the
static cache's bookkeeping equal to RowCache's, the keyed artefact cache, and the choice of path
(a machine without a C++ compiler). Tiny models, few shapes: each graph takes ~10 s to build."""

import copy
import json
import re

import pytest
import torch
from conftest import ARCHS, tiny_target
from test_decoding import random_head

from eaglespec.core.attention import additive_mask
from eaglespec.core.config import parse_tree
from eaglespec.draft.head import EagleHead
from eaglespec.engine import compiled, gemm_kernels
from eaglespec.engine.compiled import CompiledSteps, StaticRows, artefact_dir, compile_mode, resolve_mode
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.engine.gemm_kernels import GemmBlock
from eaglespec.engine.kv_cache import RowCache
from eaglespec.errors import EagleError

PROMPT = [5, 17, 33, 9, 64, 21, 7, 90, 11, 3]
needs_cxx = pytest.mark.skipif(compiled.compiler_problem() is not None,
                               reason=f"inductor's C++ backend cannot build here: {compiled.compiler_problem()}")


@pytest.fixture(scope="module")
def _inductor_folder(tmp_path_factory):
    return tmp_path_factory.mktemp("inductor")


@pytest.fixture(autouse=True)
def _inductor_cache(_inductor_folder, monkeypatch):
    """Inductor's caches in one folder for this module's tests (artefact_dir would otherwise set the
    variable for the process to the first test's artefact folder): what one test compiled and
    autotuned, another finds. Packages (AOT builds) skip inductor's graph cache; what they share is
    keyed by the generated source, which holds the micro-GEMM block and prefetch a test patches in.
    Each test still has its own eaglespec cache (conftest), so packages are built per test. (This
    module took 814 s with a folder per test and 737 s shared, run one after the other on 2 Zen 4 cores.)"""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(_inductor_folder))


def compiled_target(arch, dtype=torch.float64, autotune=False):
    target = tiny_target(arch, dtype=dtype)
    target.steps = CompiledSteps(target, progress=False, autotune=autotune)
    return target


def ids(gen, n=40, speculative=True, prompt=PROMPT):
    return gen.generate(input_ids=prompt, max_new_tokens=n, speculative=speculative, stop_token_ids=set()).token_ids


def drafted(gen, n=24):
    """The tokens of every tree the drafter proposed while generating n tokens."""
    trees = []
    for _ in gen.stream(PROMPT, n, stop_token_ids=set(), observe=lambda tree, logits, acc: trees.append(tree.tokens.tolist())):
        pass
    return trees


def chain_step(t, q: int):
    """The features and logits of a q-token chain (tokens 3, 4, ...) verified after PROMPT: the
    target's verification step at q tokens. -> ([q, H], [q, V])"""
    cache = t.new_cache()
    t.forward(torch.tensor([PROMPT]), cache)
    mask, depth = torch.ones(1, q, q, dtype=torch.bool).tril(), torch.arange(q)[None]
    states, logits = t.verify_rows(torch.arange(3, 3 + q)[None], t.start_rows(cache, [len(PROMPT)], 32), mask, depth, [q])
    return states.features[0, :q], logits[0]


@needs_cxx
@pytest.mark.parametrize("arch", ARCHS)
def test_compiled_vanilla_and_eagle_equal_eager_vanilla(arch):
    """Vanilla and EAGLE on the compiled step give eager vanilla's ids, the compiled head drafts
    the very trees the eager head drafts (qwen3's head has two decoder layers: the static head
    cache holds each), and a 4-token chain's logits and features (the verification graph those runs
    built) equal the eager forward's within fp32 rounding."""
    layers = 2 if arch == "qwen3" else 1
    eager = tiny_target(arch)
    reference = ids(EagleGenerator(eager, None), speculative=False)
    target = compiled_target(arch)
    assert ids(EagleGenerator(target, None), speculative=False) == reference
    gen = EagleGenerator(target, random_head(target, layers=layers), "chain:3")
    assert ids(gen) == reference
    assert drafted(gen) == drafted(EagleGenerator(eager, random_head(eager, layers=layers), "chain:3"))
    keys = set(target.steps._runners)
    assert {k[:2] for k in keys if k[3] is None} == {(1, 1), (1, 4)}  # the target: vanilla, root + 3 drafts
    assert any(isinstance(k[3], str) and k[3].startswith("heagle1-") for k in keys)  # the head's steps compiled too
    assert any(isinstance(k[3], str) and k[3].startswith("deagle1-") for k in keys)  # and its draft LM head
    (f_e, l_e), (f_c, l_c) = chain_step(eager, 4), chain_step(target, 4)
    assert l_c.shape == l_e.shape == (4, eager.vocab_size)
    # within fp32 rounding, not fp64's: HF computes RoPE's angles in fp32 whatever the model's dtype,
    # and the compiled kernels round those otherwise (2.4e-7 seen on logits of magnitude 4)
    assert (l_c - l_e).abs().max() <= 1e-5 * max(1.0, l_e.abs().max().item()) and (f_c - f_e).abs().max() <= 1e-5
    assert set(target.steps._runners) == keys  # no graph beyond those the generations built


@needs_cxx
def test_compiled_logits_are_eager_logits_within_fp32_rounding():
    """fp32 and max-autotune, where inductor's own C++ GEMMs replace MKL: a 5-node tree's logits
    (padded to the 8-token bucket) against the eager tree forward."""
    eager = tiny_target("llama", dtype=torch.float32)
    target = compiled_target("llama", dtype=torch.float32, autotune=True)
    mask = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 0, 1, 0, 1]],
                        dtype=torch.bool)[None]
    depth = torch.tensor([[0, 1, 1, 2, 2]])
    tokens = torch.tensor([[3, 4, 5, 6, 7]])
    out = []
    for t in (eager, target):
        cache = t.new_cache()
        t.forward(torch.tensor([PROMPT]), cache)
        rows = t.start_rows(cache, [len(PROMPT)], 32)
        states, logits = t.verify_rows(tokens, rows, mask, depth, [5])
        out.append((states.features[0, :5], logits[0]))
    (f_e, l_e), (f_c, l_c) = out
    assert l_c.shape == l_e.shape == (5, eager.vocab_size)
    assert (l_c - l_e).abs().max() <= 1e-4 * max(1.0, l_e.abs().max().item())
    assert torch.equal(l_c.argmax(-1), l_e.argmax(-1))
    assert (f_c - f_e).abs().max() <= 1e-4


@needs_cxx
def test_no_recompilation_while_decoding():
    """After the first generation built its graphs, a 100-token generation (EAGLE and vanilla)
    compiles nothing: dynamo's counters stay put."""
    from torch._dynamo.utils import counters

    target = compiled_target("llama")
    gen = EagleGenerator(target, random_head(target), "chain:3")
    ids(gen, 8)
    ids(gen, 8, speculative=False)
    built = target.steps.stats.graphs
    counters.clear()
    ids(gen, 100, prompt=PROMPT[:4])
    ids(gen, 100, speculative=False, prompt=PROMPT + PROMPT)
    assert target.steps.stats.graphs == built
    assert counters["stats"]["unique_graphs"] == 0, dict(counters["stats"])
    assert not counters["recompiles"], dict(counters["recompiles"])


@needs_cxx
def test_a_floored_tree_is_warmed_at_every_width_it_may_verify():
    """A tree with a confidence floor verifies 1 to all of its nodes from step to step: `warm`
    builds each of those widths' graphs up front, so decoding builds nothing, and the output is
    vanilla's."""
    target = compiled_target("llama")
    gen = EagleGenerator(target, random_head(target), "chain:6")
    gen.draft_floor = 0.0005  # a random head: steps verify one to three nodes (test_decoding)
    gen.warm()
    assert {k[1] for k in target.steps._runners if k[3] is None} >= {1, 2, 4, 8}
    built = target.steps.stats.graphs
    vanilla = ids(gen, 40, speculative=False)
    sizes = set()
    out = []
    for step in gen.stream(PROMPT, 40, stop_token_ids=set()):
        out += step.tokens
        sizes.add(step.stats.tree_size)
    assert out == vanilla and len(sizes) >= 2
    assert target.steps.stats.graphs == built


@needs_cxx
def test_batched_compiled_equals_each_sequence_alone():
    """Four prompts of different lengths and budgets decode together on the compiled path as each
    does alone eagerly; rows leave as their budgets end: the second first (the rows after it move
    up inside the bucket of 4), then the fourth (the bucket shrinks to 2), then the third."""
    eager = tiny_target("qwen2")
    prompts, budgets = [PROMPT, [8, 4], [40, 41, 42, 43, 44, 45], [9, 10, 11]], [30, 6, 21, 12]
    expected = [EagleGenerator(eager, None).generate(input_ids=p, max_new_tokens=b, speculative=False,
                                                     stop_token_ids=set()).token_ids for p, b in zip(prompts, budgets)]
    target = compiled_target("qwen2")
    gen = EagleGenerator(target, random_head(target), "chain:3")
    batch, tokens = gen.new_batch(), {}
    for p, b in zip(prompts, budgets):
        seq, first = batch.add(list(p), b)
        tokens[seq] = list(first.tokens)
    while len(batch):
        for seq, out in batch.step():
            tokens[seq] += out.tokens
    assert list(tokens.values()) == expected


@needs_cxx
def test_warm_batches_builds_every_step_a_batch_then_runs():
    """With --tree auto's per-batch choices (here: 1 row a 3-node tree, 2 rows a 1-node tree, 4
    rows no drafts), warm and warm_batches(4) leave nothing to build for what a server then runs:
    3 rows (the 4-row bucket with the 2-row choice) shrinking to 2 and 1 as they finish, 4 rows,
    and a request without drafts beside a drafted one. Past the largest rows bucket, warm_batches
    refuses before building anything."""
    from eaglespec.core.config import SamplingParams
    from eaglespec.core.tree import static_tree
    from eaglespec.engine.tuning import BatchChoice, TunedTree

    target = compiled_target("qwen2")
    small, big = static_tree([(0,)]), static_tree([(0,), (1,), (0, 0)])
    gen = EagleGenerator(target, random_head(target), big)
    gen.tuned = TunedTree(big, 2.0, 1.5, [(1, 1.6, 0.001, 0.010, 1.45), (3, 2.0, 0.002, 0.010, 1.67)], 0.010,
                          by_batch=(BatchChoice(2, small, 1.2), BatchChoice(4, None, 0.9)), trees=((1, small), (3, big)))
    with pytest.raises(EagleError, match="largest bucket"):
        gen.warm_batches(compiled.BATCH_BUCKETS[-1] + 1)
    assert target.steps.stats.graphs == 0
    lines = []
    gen.warm()
    one_row = target.steps.stats.graphs
    gen.warm_batches(4, say=lines.append)
    assert target.steps.stats.graphs > one_row and len(lines) == 4 and "4 rows ready" in lines[3], lines
    built = target.steps.stats.graphs

    def serve(budgets, speculative):
        batch = gen.new_batch()
        for i, (budget, drafted) in enumerate(zip(budgets, speculative)):
            batch.add(list(range(30 + 7 * i, 50 + 9 * i)), budget, SamplingParams(), set(), speculative=drafted)
        while len(batch):
            batch.step()

    serve([6, 10, 14], [True] * 3)
    serve([8] * 4, [True] * 4)
    serve([8, 8], [True, False])
    # short prompts: their pairs (4, 11) are wider than the drafter's absorb and run the head eagerly
    for prompt in ([5, 9, 13, 17, 21], list(range(40, 52))):
        gen.generate(input_ids=prompt, max_new_tokens=6, stop_token_ids=set())
    assert target.steps.stats.graphs == built


def test_warm_batches_on_eager_kernels_builds_nothing_and_has_no_bucket_limit():
    target = tiny_target("qwen2")
    gen = EagleGenerator(target, random_head(target), "chain:3")
    gen.warm_batches(1000, say=lambda line: pytest.fail(f"eager kernels build nothing: {line}"))


# ---- the static cache's bookkeeping (no compiling) -----------------------------------------------
def test_static_rows_keep_select_extend_like_row_cache():
    """The same appends, accepted paths, leaving and joining on StaticRows and on RowCache leave
    every row's valid entries equal."""
    target = tiny_target("llama")

    def prefilled(prompt):
        cache = target.new_cache()
        target.forward(torch.tensor([prompt]), cache)
        return cache

    def entries(rows, r):
        n = int(rows.lens[r])
        if isinstance(rows, StaticRows):
            return [t[r, :, :n] for t in rows.keys + rows.values]
        return [layer.keys[r, :, :n] for layer in rows.cache.layers] + [layer.values[r, :, :n] for layer in rows.cache.layers]

    prompts = [PROMPT, [8, 4], [40, 41, 42], [5, 6, 7, 8, 9]]
    dynamic = RowCache(prefilled(prompts[0]), [len(prompts[0])])
    static = StaticRows.from_dynamic(prefilled(prompts[0]), [len(prompts[0])], 64)
    for p in prompts[1:]:
        dynamic.extend(RowCache(prefilled(p), [len(p)]))
        static.extend(StaticRows.from_dynamic(prefilled(p), [len(p)], 64))
    tree_mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool).repeat(4, 1, 1)
    depth = torch.tensor([0, 1, 1, 2]).repeat(4, 1)
    tokens = torch.tensor([[3, 4, 5, 6], [7, 8, 9, 10], [11, 12, 13, 14], [15, 16, 17, 18]])
    start = dynamic.length
    target.forward_rows(tokens, dynamic, tree_mask, depth)
    # the compiled step's writes, done by hand: the same keys at the same slots
    for i, layer in enumerate(dynamic.cache.layers):
        static.keys[i][:4, :, start:start + 4] = layer.keys[:, :, start:start + 4]
        static.values[i][:4, :, start:start + 4] = layer.values[:, :, start:start + 4]
    paths = [torch.tensor([0, 2, 3]), torch.tensor([0]), torch.tensor([0, 1]), torch.tensor([0, 2])]
    dynamic.keep_paths(start, paths)
    static.keep_paths(start, paths)
    assert static.lens.tolist() == dynamic.lens.tolist() and static.length == dynamic.length
    # a row leaves and the rows bucket stays (rows move up in place), then one that shrinks it
    for keep, bucket in (([0, 2, 3], 4), ([2, 0], 2)):
        for rows in (dynamic, static):
            rows.select(keep)
        assert static.lens.tolist() == dynamic.lens.tolist() and static.length == dynamic.length
        assert static.keys[0].shape[0] == bucket
        for r in range(len(keep)):
            for a, b in zip(entries(dynamic, r), entries(static, r)):
                assert torch.equal(a, b)
    # and one joins again: the rows bucket grows, the entries in use come along
    dynamic.extend(RowCache(prefilled(prompts[1]), [2]))
    static.extend(StaticRows.from_dynamic(prefilled(prompts[1]), [2], 64))
    assert static.lens.tolist() == dynamic.lens.tolist() and static.keys[0].shape[0] == 4
    for r in range(3):
        for a, b in zip(entries(dynamic, r), entries(static, r)):
            assert torch.equal(a, b)


def test_a_joining_row_keeps_nothing_of_a_request_that_left():
    """A row that leaves stays in the rows bucket as padding (select moves nothing it need not);
    a sequence that joins there, with a smaller cache, must not see any of it, masked or not: a
    NaN passes through a mask's finite minimum."""
    torch.manual_seed(0)
    kv = torch.randn(2, 4, 1, 1024, 2)
    kv[:, 3] = float("nan")  # the leaving request's entries
    rows = StaticRows(kv.clone(), [5, 6, 7, 8], 8)
    rows.select([0, 1, 2])
    assert rows.kv.shape[1] == 4 and torch.equal(rows.kv[:, :3], kv[:, :3])
    rows.extend(StaticRows(torch.ones(2, 1, 1, 512, 2), [4], 4))
    assert rows.lens.tolist() == [5, 6, 7, 4] and torch.equal(rows.kv[:, :3], kv[:, :3])
    assert torch.equal(rows.kv[:, 3, :, :512], torch.ones(2, 1, 512, 2))
    assert not rows.kv[:, 3].isnan().any() and not rows.kv[:, 3, :, 512:].any()


def test_step_masks_are_the_visible_slots_and_padding_sees_itself():
    """compiled._step_inputs writes its mask in place; it must equal the mask built from the
    visible slots as core.attention.additive_mask does (rows of different lengths, a padded query
    bucket, a padded rows bucket, one row alone)."""
    torch.manual_seed(0)
    for lens, n, q, rows_bucket, extra in [([7], 3, 4, 1, 0), ([7], 4, 4, 1, 2), ([5, 9, 2], 3, 4, 4, 1), ([6, 6], 1, 1, 2, 0)]:
        b, cap = len(lens), 512
        rows = StaticRows(torch.zeros(2, rows_bucket, 1, cap, 2), lens, max(lens) + extra)
        base = max(lens)
        start = rows.length
        block = torch.rand(b, n, start + n - base) < 0.5
        block[:, :, start - base:] |= torch.eye(n, dtype=torch.bool)
        mask, slots = compiled._step_inputs(rows, b, n, q, base, block, torch.float32, "cpu")
        allowed = torch.zeros(rows_bucket, q, cap, dtype=torch.bool)
        allowed[:, :, start:start + q] = torch.eye(q, dtype=torch.bool)
        visible = torch.cat([rows.valid(base)[:, None, :].expand(-1, n, -1), block], dim=2)
        allowed[:b, :n, :start + n] = visible
        assert torch.equal(mask, additive_mask(allowed, torch.float32)), (lens, n, q)
        assert slots.tolist() == list(range(start, start + q))


def test_buckets():
    assert [compiled.bucket(n, compiled.QUERY_BUCKETS) for n in (1, 2, 3, 5, 9)] == [1, 2, 4, 8, 16]
    assert compiled.bucket(300, compiled.CACHE_BUCKETS) == 512
    with pytest.raises(EagleError, match="largest bucket"):
        compiled.bucket(65, compiled.QUERY_BUCKETS)
    steps = CompiledSteps(tiny_target("llama"), progress=False)
    assert steps.tree_sizes((1, 2, 3, 4, 5, 6, 8, 10, 16, 31)) == (1, 3, 7)
    assert steps.tree_sizes((1, 2, 3, 4, 5)) == (1, 3) and steps.tree_sizes(()) == ()


# ---- choosing the path -------------------------------------------------------------------------
def test_no_cxx_compiler(monkeypatch):
    """auto: a one-line note and eager decoding; on: a one-line error naming the cause and the fix."""
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(compiled.shutil, "which", lambda name: None)
    on, why = resolve_mode("auto", torch.device("cpu"))
    assert not on and "no C++ compiler" in why and "\n" not in why
    with pytest.raises(EagleError, match=r"--compile on: no C\+\+ compiler.*apt-get install g\+\+.*--compile off"):
        resolve_mode("on", torch.device("cpu"))
    target = tiny_target("llama")
    assert "no C++ compiler" in compiled.use_compiled(target, "auto") and target.steps.name == "eager"


def test_a_broken_cxx_compiler_is_found_before_inductor_meets_it(monkeypatch, tmp_path):
    """A compiler on PATH that cannot build a shared library (headers missing, a broken
    toolchain) is a problem: auto runs eagerly with a one-line note, on is a one-line error."""
    broken = tmp_path / "g++"
    broken.write_text("#!/bin/sh\necho 'probe.cpp:1:10: fatal error: vector: No such file or directory' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CXX", str(broken))
    problem = compiled.compiler_problem()
    assert problem is not None and "cannot build a shared library" in problem and "vector" in problem
    on, why = resolve_mode("auto", torch.device("cpu"))
    assert not on and "cannot build" in why and "\n" not in why
    with pytest.raises(EagleError, match=r"--compile on: the C\+\+ compiler .* cannot build.*--compile off"):
        resolve_mode("on", torch.device("cpu"))


def test_auto_stays_eager_on_cuda_and_on_still_compiles_there():
    """The compiled path crashed on the one GPU it ran on (docs/gpu.md): auto says so and runs
    eagerly; on takes the compiled path (no torch.cuda call is needed to decide)."""
    on, why = resolve_mode("auto", torch.device("cuda"))
    assert not on and why.startswith("eager kernels: ") and "docs/gpu.md" in why and "--compile on" in why
    assert resolve_mode("on", torch.device("cuda"))[0] is True
    assert resolve_mode("off", torch.device("cuda"))[0] is False


@needs_cxx
def test_packages_off_compiles_in_process(monkeypatch, tmp_path):
    monkeypatch.setenv("EAGLESPEC_CACHE", str(tmp_path))
    target = tiny_target("llama")
    why = compiled.use_compiled(target, "on")
    assert target.steps.folder is not None and "artefacts in" in why
    monkeypatch.setenv(compiled.PACKAGES_ENV, "OFF")
    again = tiny_target("llama")
    why = compiled.use_compiled(again, "on")
    assert again.steps.folder is None and "compiled in this process" in why and "artefacts in" not in why


def test_trees_and_batches_beyond_the_buckets(capsys):
    """auto runs them eagerly, said so; on refuses them in one line, before the target loads."""
    from eaglespec.cli.commands import main

    on, why = resolve_mode("auto", torch.device("cpu"), tokens=65)
    assert not on and why == "eager kernels: the --tree verifies 65 tokens, beyond the compiled path's 64"
    on, why = resolve_mode("auto", torch.device("cpu"), rows=65)
    assert not on and "--max-batch 65 is beyond" in why
    assert resolve_mode("off", torch.device("cpu"), tokens=65)[0] is False
    with pytest.raises(EagleError, match=r"--compile on: --max-batch 100 .*lower it, or use --compile off"):
        resolve_mode("on", torch.device("cpu"), rows=100)
    compiled.check_limits("auto", tokens=65, rows=100)  # auto: no error, the fallback is use_compiled's
    assert main(["generate", "--compile", "on", "--tree", "eagle2:70,5,10", "--prompt", "hi",
                 "--target", "/nonexistent/model"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--compile on: the --tree verifies 70 tokens" in err[-1] and "lower it" in err[-1]


@pytest.mark.parametrize("command", ["generate", "chat", "serve", "bench", "bench-batch", "tune", "certify", "compile"])
def test_every_command_takes_compile(command, capsys):
    """--compile auto|on|off on every command that decodes (issue 18's list, and `compile`); the
    default is None (EAGLESPEC_COMPILE, else auto); another value is argparse's one-line error."""
    from eaglespec.cli.commands import build_parser

    extra = ["--head", "x"] if command == "tune" else []
    parser = build_parser()
    for mode in ("auto", "on", "off"):
        assert parser.parse_args([command, "--compile", mode, *extra]).compile == mode
    assert parser.parse_args([command, *extra]).compile is None
    with pytest.raises(SystemExit):
        parser.parse_args([command, "--compile", "sometimes", *extra])
    assert "invalid choice: 'sometimes'" in capsys.readouterr().err


def test_no_cxx_compiler_cli(monkeypatch, capsys):
    from eaglespec.cli.commands import main

    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(compiled.shutil, "which", lambda name: None)
    assert main(["generate", "--compile", "on", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--compile on: no C++ compiler" in err[0]


def test_compile_mode_reads_the_environment_and_refuses_bad_values(monkeypatch):
    monkeypatch.setenv("EAGLESPEC_COMPILE", "on")
    assert compile_mode(None) == "on"
    assert compile_mode("off") == "off"
    assert compile_mode("auto", quantize="int8") == "off"  # the int8 kernel stays eager
    with pytest.raises(EagleError, match="--compile on with --quantize int8"):
        compile_mode("on", quantize="int8")
    monkeypatch.setenv("EAGLESPEC_COMPILE", "fast")
    with pytest.raises(EagleError, match="--compile 'fast': choose auto, on or off"):
        compile_mode(None)


@needs_cxx
@pytest.mark.parametrize("failure", ["inductor", "disk", "disk-text"])
def test_a_graph_that_cannot_be_built_is_one_line_with_on_and_eager_decoding_with_auto(tmp_path, monkeypatch, failure):
    """A package build that fails (an error inside inductor, a full disk) keeps nothing half-built:
    --compile on is a one-line error naming the cause and the fix; --compile auto runs the eager
    kernels, says why, and decodes eager vanilla's ids."""
    import errno

    from eaglespec.engine import decoding

    monkeypatch.setenv("EAGLESPEC_CACHE", str(tmp_path))
    built = []

    def fail(self, program, path, apart, backends, block):
        path.write_bytes(b"half a package")
        built.append(path)
        if failure == "disk":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        if failure == "disk-text":  # a C++ build out of space: the compiler's text, not an OSError
            raise RuntimeError("C++ compile error\n/tmp/x.o: No space left on device")
        raise RuntimeError("C++ compile failed:\nerror: expected ';'")

    monkeypatch.setattr(CompiledSteps, "_package", fail)
    monkeypatch.setattr(decoding, "load_target", lambda *args, **kwargs: tiny_target("llama", dtype=torch.float32))
    with pytest.raises(EagleError) as caught:
        EagleGenerator.from_pretrained(None, None, "chain:3", compile="on")
    message = str(caught.value)
    cause = {"disk": f"no space left on the disk while building the target's step for 1 row(s) x 1 token(s) x 512 cache slots (writing {tmp_path}",
             "disk-text": "no space left on the disk while building the target's step for 1 row(s) x 1 token(s) x 512 cache slots (its package goes to",
             "inductor": "RuntimeError: C++ compile failed: error: expected ';'"}[failure]
    assert "\n" not in message and cause in message and "--compile off" in message and "nothing half-built" in message
    assert built and not any(p.exists() for p in built) and not list(tmp_path.rglob("*.pt2"))
    gen = EagleGenerator.from_pretrained(None, None, "chain:3", compile="auto")
    assert gen.target.steps.name == "eager" and gen.compile_note.startswith("eager kernels: ") and cause in gen.compile_note
    assert ids(gen, speculative=False) == ids(EagleGenerator(tiny_target("llama", dtype=torch.float32), None), speculative=False)
    # two starts: an error inside inductor builds each start's graph twice (its constants beside it,
    # then inside), a full disk once (building again cannot help)
    assert len(built) == (4 if failure == "inductor" else 2)
    if failure == "inductor":
        assert compiled.disk_full(caught.value) is None


@needs_cxx
@pytest.mark.parametrize("failing", ["head", "target"])
def test_a_bf16_head_whose_graphs_fail_drafts_in_the_targets_dtype_still_compiled(tmp_path, monkeypatch, failing):
    """--draft-dtype auto chose bf16 (AMX) and only the bf16 head's graphs fail to build: the head
    runs in the target's dtype on the compiled steps, says why, and decodes eager vanilla's ids,
    with --compile auto and with on. A target's graph that fails is not retried so: eager kernels
    with auto, the error with on. (One test for both modes: the second start loads the packages
    the first built, as a user's second start would, and meets the same failing head graph.)"""
    from eaglespec.engine import decoding

    monkeypatch.setenv("EAGLESPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(decoding, "cpu_identity", lambda: {"cpu": "test", "flags": ["avx512f", "amx_bf16"]})
    monkeypatch.setattr(decoding, "load_target", lambda *args, **kwargs: tiny_target("llama", dtype=torch.float32))
    torch.manual_seed(1)
    EagleHead(tiny_target("llama").config).save_pretrained(tmp_path / "head")
    package = CompiledSteps._package

    tried = []

    def fail_bf16(self, program, path, apart, backends, block):
        tried.append(path.name)
        # the bf16 head's graphs (their tag ends so), or the target's (tag "f": its feature alone)
        if ("bfloat16" in path.name) if failing == "head" else bool(re.search(r"x\d+-f[.-]", path.name)):
            raise RuntimeError("C++ compile failed:\nerror: no bf16 here")
        return package(self, program, path, apart, backends, block)

    monkeypatch.setattr(CompiledSteps, "_package", fail_bf16)

    def load(mode):
        return EagleGenerator.from_pretrained(None, str(tmp_path / "head"), "chain:3", compile=mode,
                                              draft_vocab_size=None)

    if failing == "target":
        with pytest.raises(EagleError, match="no bf16 here"):
            load("on")
        assert load("auto").target.steps.name == "eager"
        assert not any("bfloat16" in name or "heagle1" in name for name in tried)  # no head graph built, none retried
        return
    vanilla = ids(EagleGenerator(tiny_target("llama", dtype=torch.float32), None), speculative=False)
    for mode in ("auto", "on"):
        tried.clear()
        gen = load(mode)
        assert any("bfloat16" in name for name in tried), mode  # each start tries the bf16 head again
        assert gen.target.steps.name != "eager" and next(gen.head.parameters()).dtype == torch.float32
        assert gen.draft_dtype_note.startswith("draft head in float32 (auto's bfloat16 head could not be built: ")
        assert "no bf16 here" in gen.draft_dtype_note
        assert ids(gen) == vanilla, mode


def test_disk_full_reads_the_whole_chain_and_stops_at_a_cycle():
    import errno

    inner = OSError(errno.EDQUOT, "Disk quota exceeded", "/data/x.pt2")
    outer = RuntimeError("building failed")
    outer.__cause__ = inner
    assert compiled.disk_full(outer) == "/data/x.pt2" and compiled.disk_full(OSError(errno.ENOSPC, "full")) == ""
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__cause__, b.__cause__ = b, a
    assert compiled.disk_full(a) is None and compiled.disk_full(ValueError("x")) is None


def test_artefact_cache_is_keyed_and_a_foreign_or_damaged_one_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    target = tiny_target("llama")
    folder, note = artefact_dir(target, tmp_path)
    assert note == "" and folder.parent == tmp_path / "compiled"
    manifest = json.loads((folder / compiled.MANIFEST).read_text())
    assert manifest["key"]["target"] == target.fingerprint() and manifest["key"]["threads"] == torch.get_num_threads()
    import os

    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(folder / "inductor")
    (folder / "inductor" / "artefact").write_text("kept")
    packages = ["step-1x1x512-heagle1-0123456789abcdef.pt2", "step-1x1x512-f.pt2", "step-1x1x0-deagle1-target.pt2"]
    for name in packages:
        (folder / name).write_bytes(b"package")
    assert artefact_dir(target, tmp_path) == (folder, "")  # same key: trusted, kept
    assert (folder / "inductor" / "artefact").is_file()
    # half-written packages: a killed compile's (no such process, untouched for over an hour) removed,
    # said so; a live process's kept, and a recent one's (perhaps another container's writer) too
    dead, alive = folder / ".step-1x2x512-f.999999999.partial.pt2", folder / f".step-1x4x512-f.{os.getpid()}.partial.pt2"
    recent = folder / ".step-1x8x512-f.999999998.partial.pt2"
    for path in (dead, alive, recent):
        path.write_bytes(b"x" * 3_000_000)
    for path in (dead, alive):
        os.utime(path, (0, 0))
    _, note = artefact_dir(target, tmp_path)
    assert not dead.exists() and alive.exists() and recent.exists()
    assert "removed 1 half-written" in note and "(3 MB)" in note
    alive.unlink()
    recent.unlink()
    assert sorted(p.name for p in folder.glob("*.pt2")) == sorted(packages)
    # another target (other weights) gets another folder, and so does another micro-GEMM block
    other, _ = artefact_dir(tiny_target("llama", seed=5), tmp_path)
    assert other != folder
    assert manifest["key"]["gemm_block"] == str(gemm_kernels.cpu_gemm_block())
    with monkeypatch.context() as m:
        m.setattr(gemm_kernels, "cpu_gemm_block", lambda: GemmBlock(3))
        three = artefact_dir(target, tmp_path)[0]
        m.setattr(gemm_kernels, "cpu_gemm_block", lambda: GemmBlock(3, 16))
        assert len({three, artefact_dir(target, tmp_path)[0], folder, other}) == 4
    # a manifest of another key, then a damaged one: emptied, said so, rebuilt
    (folder / compiled.MANIFEST).write_text(json.dumps({"key": {"scheme": 0}}))
    again, note = artefact_dir(target, tmp_path)
    assert again == folder and "another key" in note and not (folder / "inductor" / "artefact").exists()
    (folder / compiled.MANIFEST).write_text("{not json")
    _, note = artefact_dir(target, tmp_path)
    assert "unreadable" in note and json.loads((folder / compiled.MANIFEST).read_text())["key"] == manifest["key"]
    # a user's own TORCHINDUCTOR_CACHE_DIR is respected for inductor's scratch files
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert artefact_dir(target, tmp_path)[0] == folder
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")


@needs_cxx
def test_packages_are_built_once_loaded_after_and_rebuilt_when_damaged(tmp_path, capsys):
    """The AOTInductor path: a first start builds and keeps a package per graph; a second start
    (a new CompiledSteps) loads it without compiling and decodes the same ids; a damaged package
    is said so and rebuilt; no partial file is left."""
    eager = tiny_target("llama")
    reference = ids(EagleGenerator(eager, None), 12, speculative=False)
    target = tiny_target("llama")
    target.steps = CompiledSteps(target, progress=True, autotune=False, folder=tmp_path)
    assert ids(EagleGenerator(target, None), 12, speculative=False) == reference
    (package,) = tmp_path.glob("step-*.pt2")
    assert "compiling" in capsys.readouterr().err
    again = tiny_target("llama")
    again.steps = CompiledSteps(again, progress=True, autotune=False, folder=tmp_path)
    assert ids(EagleGenerator(again, None), 12, speculative=False) == reference
    assert "compiling" not in capsys.readouterr().err
    package.write_bytes(b"not a package")
    third = tiny_target("llama")
    third.steps = CompiledSteps(third, progress=True, autotune=False, folder=tmp_path)
    assert ids(EagleGenerator(third, None), 12, speculative=False) == reference
    err = capsys.readouterr().err
    assert "ignored the compiled package" in err and "compiling" in err
    assert [p.name for p in tmp_path.glob("*.pt2")] == [package.name] and not list(tmp_path.glob(".*partial*"))


def test_a_head_in_another_dtype_than_the_target_has_its_own_packages():
    """The digest reads values only: bf16 weights and the same weights cast to the target's dtype
    must not share a package name (one's constants are bf16), while the ordinary case (the head in
    the target's dtype) keeps the name it always had."""
    target = tiny_target("llama")
    steps = CompiledSteps(target, progress=False, autotune=False)
    torch.manual_seed(0)
    head = EagleHead(target.config).to(torch.bfloat16)
    low = steps.head_steps(head).tag
    same = steps.head_steps(copy.deepcopy(head).to(target.dtype)).tag
    assert low == same + "-bfloat16" and same.startswith("heagle1-") and "float" not in same


@needs_cxx
def test_a_bf16_draft_head_on_the_compiled_steps_changes_no_output():
    """--draft-dtype bfloat16 on compiled steps: the head's step and the draft's scores run as bf16
    graphs of their own, and EAGLE's ids stay eager vanilla's (a reduced vocabulary and its
    context tokens included)."""
    reference = ids(EagleGenerator(tiny_target("llama"), None), speculative=False)
    target = compiled_target("llama")
    torch.manual_seed(1)
    gen = EagleGenerator(target, EagleHead(target.config).to(target.dtype), "chain:3", draft_vocab=torch.arange(16))
    gen.use_draft_dtype("bfloat16")
    assert ids(gen) == reference
    (drafter,) = gen._drafters.values()
    assert isinstance(drafter.steps, compiled.CompiledHeadSteps) and drafter.steps.tag.endswith("-bfloat16")
    assert any(key[3].endswith("-bfloat16") for key in target.steps._runners if isinstance(key[3], str)
               and key[3].startswith("d"))  # the draft's scores: a bf16 graph too


@needs_cxx
def test_packages_share_their_constants(tmp_path):
    """Packages keep their constants beside the .so (SharedConstants): a constant that names one of
    the module's tensors is that tensor, and the weights inductor laid out again for its GEMMs are
    held once for every query size. The steps still compute what eager does."""
    import zipfile

    eager = tiny_target("llama")
    target = tiny_target("llama")
    target.steps = CompiledSteps(target, progress=False, autotune=False, folder=tmp_path)
    prompt = torch.tensor([PROMPT])

    def verify(t, q):
        cache = t.new_cache()
        t.forward_states(prompt, cache)
        rows = t.start_rows(cache, [len(PROMPT)], len(PROMPT) + q)
        mask = torch.ones(1, q, q, dtype=torch.bool).tril()
        return t.verify_rows(torch.arange(1, q + 1)[None], rows, mask, torch.arange(q)[None], [q])[1][0]

    torch.testing.assert_close(verify(target, 1), verify(eager, 1), rtol=1e-5, atol=1e-5)
    pool = target.steps.constants
    first, read = dict(pool.tensors), pool.bytes_read
    (package,) = tmp_path.glob("step-*.pt2")
    stored = sum(i.file_size for i in zipfile.ZipFile(package).infolist() if "/data/weights/" in i.filename)
    assert 0 < read < stored  # the module's own tensors (norms, embedding) were bound, not read
    torch.testing.assert_close(verify(target, 2), verify(eager, 2), rtol=1e-5, atol=1e-5)
    packages = sorted(tmp_path.glob("step-*.pt2"))
    assert len(packages) == 2 and all(any(n.endswith(compiled.SharedConstants.CONFIG) for n in zipfile.ZipFile(p).namelist())
                                      for p in packages)  # both keep their constants beside the .so
    assert first and pool.tensors.keys() == first.keys() and pool.bytes_read > read  # read, and found in the pool


class _FakeGraph:
    """What GraphLowering.allocate_non_dup_const_name reads and writes."""

    def __init__(self):
        self.constants, self.constant_reprs, self.allocated_constant_name = {}, {}, {}

    def qualify_name(self, name):
        return name


def test_constants_a_pass_names_alike_get_original_names_of_their_own():
    """torch 2.13 gives the q/k/v weights it packs one original name ("constant66" three times),
    which loses two of them from a package's weights_config.json; while a package is built each
    gets its own, and a named constant (a parameter's fqn) keeps its name."""
    from torch._inductor.graph import GraphLowering

    def allocate(graph):
        for name in ("constant66", "constant66", "constant66", "layers.0.weight"):
            GraphLowering.allocate_non_dup_const_name(graph, name, torch.randn(3))
        return graph.allocated_constant_name

    stock = allocate(_FakeGraph())
    assert len(set(stock.values())) == 2  # the collision the hook is for (if torch fixes it, this test says so)
    with compiled._unique_constant_names() as hooked:
        names = allocate(_FakeGraph())
    assert hooked and len(set(names.values())) == 4 and names["layers_0_weight"] == "layers.0.weight"
    assert GraphLowering.allocate_non_dup_const_name is not None and allocate(_FakeGraph()) == stock  # unhooked after


@needs_cxx
@pytest.mark.parametrize("fails", ["package", "bind"])
def test_a_graph_whose_constants_cannot_be_shared_is_packaged_with_them_inside(tmp_path, monkeypatch, capsys, fails):
    """Constants that cannot be kept beside the .so (oneDNN's opaque packed weights cannot be
    pickled) or do not bind: the graph is built again with them inside, said so, never kept
    half-working, and decodes what eager does."""
    import zipfile

    target = tiny_target("llama")
    steps = CompiledSteps(target, progress=True, autotune=False, folder=tmp_path)
    calls = []
    package, bind = steps._package, steps.constants.bind

    def failing_package(program, path, apart, backends, block):
        calls.append(apart)
        if apart and fails == "package":
            raise RuntimeError("NotImplementedError: Cannot access storage of OpaqueTensorImpl")
        package(program, path, apart, backends, block)

    def failing_bind(runner, path, module):
        if fails == "bind" and calls == [True]:
            raise RuntimeError("Cannot find constants constant66_0 in constants_map!")
        bind(runner, path, module)

    monkeypatch.setattr(steps, "_package", failing_package)
    monkeypatch.setattr(steps.constants, "bind", failing_bind)
    target.steps = steps
    eager = tiny_target("llama")
    assert ids(EagleGenerator(target, None), 6, speculative=False) == ids(EagleGenerator(eager, None), 6, speculative=False)
    assert calls == [True, False] and "building it again with them inside" in capsys.readouterr().err
    (kept,) = tmp_path.glob("step-*.pt2")
    assert not any(n.endswith(compiled.SharedConstants.CONFIG) for n in zipfile.ZipFile(kept).namelist())
    assert not steps.constants.tensors and not list(tmp_path.glob(".*partial*"))


def _kernels(package) -> str:
    """The generated C++ of a package (wrapper and kernels)."""
    import zipfile

    with zipfile.ZipFile(package) as z:
        return "".join(z.read(n).decode() for n in z.namelist() if n.endswith(".cpp"))


@needs_cxx
def test_on_a_cpu_gemms_are_inductors_cpp_templates_of_the_cpus_micro_gemm_block(tmp_path):
    """max-autotune on a CPU chooses the GEMMs of a step of up to 8 rows among inductor's C++
    templates only (CPU_GEMM_BACKENDS): its products are micro-GEMMs of the generated code, not
    oneDNN's linear (which autotuning over cache-hot weights picks, and which streams slower in a
    real step); wider steps and a GPU's keep inductor's own choice. With AVX-512 the micro-GEMMs
    hold at most cpu_gemm_block().rows rows in registers (4: inductor's 8-row block ran 8-row
    products 1.3-2x slower) and prefetch the weights where it says so (Intel; AMD from 5 rows), and
    the ids stay eager's, and an 8-token verification's logits eager's within fp32 rounding. (No
    head: drafts never change the ids, and its graphs took 40% of this test's time.)"""
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    target = tiny_target("llama", dtype=torch.float32)
    target.steps = steps = CompiledSteps(target, progress=False, autotune=True, folder=tmp_path)
    assert steps._gemm_backends(1, 1) == steps._gemm_backends(1, 8) == steps._gemm_backends(8, 1) == "CPP"
    assert gemm_kernels.CPU_GEMM_BACKENDS == "CPP" and steps._gemm_backends(1, 16) is steps._gemm_backends(4, 4) is None
    eager = tiny_target("llama", dtype=torch.float32)
    assert ids(EagleGenerator(target, None), 4, speculative=False) == ids(EagleGenerator(eager, None), 4, speculative=False)
    (_, got), (_, want) = chain_step(target, 8), chain_step(eager, 8)
    assert (got - want).abs().max() <= 1e-4 * max(1.0, want.abs().max().item()) and torch.equal(got.argmax(-1), want.argmax(-1))
    for q in (1, 8):
        (kept,) = tmp_path.glob(f"step-1x{q}x*-f.pt2")
        code = _kernels(kept)
        assert "micro_gemm" in code and "linear_pointwise" not in code
        if "avx512" in str(pick_vec_isa()).lower():
            blocks = {int(r) for r in re.findall(r"micro_gemm_kernel<(\d+),", code)}
            assert blocks and max(blocks) <= gemm_kernels.cpu_gemm_block().rows == 4, blocks
        assert ("__builtin_prefetch(B + (k + " in code) == bool(gemm_kernels.cpu_gemm_block().at_rows(q).prefetch)


@needs_cxx
def test_the_weights_prefetch_is_in_the_micro_gemms_and_changes_no_id(tmp_path, monkeypatch):
    """A block with a prefetch distance puts one L2 prefetch of the weights, that many k-rows ahead,
    in each fp32 micro-GEMM kernel of every step of at least its prefetch_rows rows, and none in a
    narrower step's, whatever this CPU's own block; a prefetch changes no arithmetic, so the ids
    stay eager's and a 4-token verification's logits eager's within fp32 rounding. (One block covers
    both sides: the vanilla step has 1 row, the verification 4. Blocks with no prefetch, or a
    prefetch at every width, were two more compiles of the same code paths; GemmBlock.at_rows,
    which picks between them, has its own test.)"""
    block = GemmBlock(2, 16, prefetch_rows=4)
    monkeypatch.setattr(gemm_kernels, "cpu_gemm_block", lambda: block)
    target = tiny_target("llama", dtype=torch.float32)
    target.steps = CompiledSteps(target, progress=False, autotune=True, folder=tmp_path)
    eager = tiny_target("llama", dtype=torch.float32)
    assert ids(EagleGenerator(target, None), 8, speculative=False) == ids(EagleGenerator(eager, None), 8, speculative=False)
    (_, got), (_, want) = chain_step(target, 4), chain_step(eager, 4)
    assert (got - want).abs().max() <= 1e-4 * max(1.0, want.abs().max().item()) and torch.equal(got.argmax(-1), want.argmax(-1))
    kept = {int(re.match(r"step-1x(\d+)x", p.name)[1]): p for p in tmp_path.glob("step-1x*-f.pt2")}
    assert {1, 4} <= set(kept)  # the vanilla step and the chain's verification
    for q, package in kept.items():
        code = _kernels(package)
        kernels = len(re.findall(r"inline void \w+_micro_gemm_kernel\(", code))  # one per GEMM of the step
        prefetched = q >= block.prefetch_rows
        assert kernels and code.count(gemm_kernels.prefetch_code(block.prefetch).strip()) == (kernels if prefetched else 0)
        assert prefetched or "__builtin_prefetch" not in code


def test_the_cpu_vendor_and_model_are_read_from_cpuinfo(monkeypatch):
    import eaglespec.engine.target as target_module

    monkeypatch.setattr(gemm_kernels, "_avx512_prefetch", lambda: True)  # as on an AVX-512 CPU
    monkeypatch.setattr(target_module, "_cpuinfo_lines", lambda: (
        "processor\t: 0", "vendor_id\t: GenuineIntel", "model name\t: Some Xeon", "flags\t\t: fpu avx2 amx_bf16"))
    assert target_module.cpu_vendor() == "GenuineIntel" and gemm_kernels.cpu_gemm_block() == GemmBlock(4, 32)
    assert target_module.cpu_identity() == {"cpu": "Some Xeon", "flags": ["avx2", "amx_bf16"]}
    monkeypatch.setattr(target_module, "_cpuinfo_lines", lambda: ())  # not Linux: no vendor, the default block
    assert target_module.cpu_vendor() == "" and gemm_kernels.cpu_gemm_block() == gemm_kernels.CPU_GEMM_BLOCK_DEFAULT == GemmBlock(4)


def test_an_intel_cpu_prefetches_only_with_avx512_kernels_and_a_template_that_takes_it(monkeypatch):
    """The prefetch is measured with AVX-512 kernels only: an Intel CPU whose kernels are AVX2 builds
    4-row blocks without it, and so does a torch whose micro-GEMM template lacks the line it follows;
    a block asked for there is built, and keyed, without it."""
    import torch._inductor.compile_fx  # noqa: F401
    from torch._inductor.codegen import cpp_micro_gemm as micro

    import eaglespec.engine.target as target_module

    monkeypatch.setattr(target_module, "cpu_vendor", lambda: "GenuineIntel")
    monkeypatch.setattr(gemm_kernels, "_avx512_prefetch", lambda: False)
    assert gemm_kernels.cpu_gemm_block() == GemmBlock(4)
    monkeypatch.undo()
    monkeypatch.setattr(target_module, "cpu_vendor", lambda: "GenuineIntel")
    template = micro.CppMicroGemmFP32Vec.TEMPLATE_KERNEL
    monkeypatch.setattr(micro.CppMicroGemmFP32Vec, "TEMPLATE_KERNEL", template.replace(gemm_kernels._LOAD_B, ""))
    gemm_kernels.prefetch_line.cache_clear()
    gemm_kernels._avx512_prefetch.cache_clear()
    try:
        assert gemm_kernels.prefetch_line() is None and gemm_kernels.cpu_gemm_block() == GemmBlock(4)
        with gemm_kernels.micro_gemms("cpu", GemmBlock(2, 32)):
            assert torch._inductor.config.post_grad_custom_post_pass.uuid() == f"eaglespec-gemm-r2-{compiled.ARTEFACT_SCHEME}"
            assert "__builtin_prefetch" not in micro.CppMicroGemmFP32Vec.TEMPLATE_KERNEL
    finally:
        monkeypatch.undo()
        gemm_kernels.prefetch_line.cache_clear()
        gemm_kernels._avx512_prefetch.cache_clear()
    assert gemm_kernels.prefetch_line() is not None


@pytest.mark.parametrize("vendor,block", [("AuthenticAMD", GemmBlock(4, 32, prefetch_rows=5)), ("GenuineIntel", GemmBlock(4, 32)),
                                          ("", GemmBlock(4))])
def test_the_gemm_kernels_patch_changes_only_fp32_avx512_blocks_and_the_fp32_template_and_is_undone(monkeypatch, vendor, block):
    """gemm_kernels.micro_gemms: while it holds, inductor's fp32 AVX-512 micro-GEMM shapes have at
    most cpu_gemm_block().rows rows (4) and every other shape is as it was, and the fp32 kernel
    template prefetches the weights where the block says so (Intel); afterwards, table and template are whole again. No patch for a GPU's builds."""
    import torch._inductor.compile_fx  # noqa: F401
    from torch._inductor.codegen import cpp_micro_gemm as micro

    import eaglespec.engine.target as target_module

    monkeypatch.setattr(target_module, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(gemm_kernels, "_avx512_prefetch", lambda: True)  # as on an AVX-512 CPU
    assert gemm_kernels.cpu_gemm_block() == block
    rows = block.rows
    table = micro.micro_gemm_configs[micro.CppMicroGemmFP32Vec]
    before, template = list(table), micro.CppMicroGemmFP32Vec.TEMPLATE_KERNEL
    assert "__builtin_prefetch" not in template
    assert any(c.vec_isa_cls is micro.VecAVX512 and c.input_dtype == torch.float32 and c.register_blocking.block_m > 4
               for c in before)  # else the patch has nothing to change in this torch
    with gemm_kernels.micro_gemms("cpu"):
        # inductor's graph cache keys on the block too (a custom pass's uuid is part of its key)
        assert torch._inductor.config.post_grad_custom_post_pass.uuid() == f"eaglespec-gemm-{block}-{compiled.ARTEFACT_SCHEME}"
        added = [line for line in micro.CppMicroGemmFP32Vec.TEMPLATE_KERNEL.split("\n") if line not in template.split("\n")]
        assert added == ([gemm_kernels.prefetch_code(block.prefetch).rstrip("\n")] if block.prefetch else [])
        for was, now in zip(before, table, strict=True):
            if was.vec_isa_cls is micro.VecAVX512 and was.input_dtype == torch.float32:
                assert now.register_blocking == (min(was.register_blocking.block_m, rows), *was.register_blocking[1:])
            else:
                assert now == was
    assert table == before and torch._inductor.config.post_grad_custom_post_pass is None
    assert micro.CppMicroGemmFP32Vec.TEMPLATE_KERNEL == template
    with gemm_kernels.micro_gemms("cuda", GemmBlock(2, 32)):
        assert table == before and micro.CppMicroGemmFP32Vec.TEMPLATE_KERNEL == template
    with gemm_kernels.micro_gemms("cpu", GemmBlock(2)), gemm_kernels.micro_gemms("cpu", GemmBlock(3, 32)):
        # nested: no deadlock, and the outer block holds (2 rows, no prefetch)
        assert max(c.register_blocking.block_m for c in table if c.vec_isa_cls is micro.VecAVX512
                   and c.input_dtype == torch.float32) == 2
        assert micro.CppMicroGemmFP32Vec.TEMPLATE_KERNEL == template
    with gemm_kernels.micro_gemms("cpu", GemmBlock(2, 8)), gemm_kernels.micro_gemms("cpu", GemmBlock(2, 8)):
        assert micro.CppMicroGemmFP32Vec.TEMPLATE_KERNEL.count("__builtin_prefetch") == 1  # once, not twice
    assert table == before


@needs_cxx
def test_a_gemm_no_allowed_backend_covers_is_built_with_inductors_default(tmp_path, capsys, monkeypatch):
    """Should inductor find no kernel for a GEMM among the allowed backends (NoValidChoicesError: a
    shape or dtype the C++ templates do not cover; raised here by a stand-in for inductor's
    packager while the C++ templates are the only backend), the package is built again with
    inductor's default choice, said so, and decodes what eager does."""
    from torch._inductor.select_algorithm import NoValidChoicesError

    real, seen = torch._inductor.aoti_compile_and_package, []

    def package(*args, **kwargs):
        seen.append(torch._inductor.config.max_autotune_gemm_backends)
        if seen[-1] == "CPP":
            raise RuntimeError("lowering failed") from NoValidChoicesError("No choices to select")
        return real(*args, **kwargs)

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", package)
    target = tiny_target("llama", dtype=torch.float32)
    target.steps = CompiledSteps(target, progress=True, autotune=True, folder=tmp_path)
    eager = tiny_target("llama", dtype=torch.float32)
    assert ids(EagleGenerator(target, None), 4, speculative=False) == ids(EagleGenerator(eager, None), 4, speculative=False)
    assert seen[0] == "CPP" and seen[1] != "CPP"
    assert "building it again with inductor's default choice of GEMMs" in capsys.readouterr().err
    assert len(list(tmp_path.glob("step-*.pt2"))) == 1 and not list(tmp_path.glob(".*partial*"))


def test_an_in_process_graph_falls_back_to_inductors_default_gemms_likewise():
    """The in-process graph (no cache folder) retries the same way, once, and keeps the default
    for later calls; any other compile error is raised as it is."""
    from torch._inductor.select_algorithm import NoValidChoicesError

    graph, seen = compiled._Jit(torch.nn.Identity(), autotune=True, gemm_backends="CPP"), []

    def module(x):
        seen.append(torch._inductor.config.max_autotune_gemm_backends)
        if seen[-1] == "CPP":
            raise RuntimeError("backend compiler failed") from NoValidChoicesError("No choices to select")
        return x + 1

    graph.module = module
    assert graph(torch.ones(1)).item() == 2 and graph(torch.ones(1)).item() == 2
    assert seen[0] == "CPP" and "CPP" not in seen[1:] and len(seen) == 3 and graph.gemm_backends is None
    graph.module = lambda x: (_ for _ in ()).throw(ValueError("another failure"))
    with pytest.raises(ValueError, match="another failure"):
        graph(torch.ones(1))


@needs_cxx
def test_another_head_of_the_same_kind_never_loads_this_ones_packages(tmp_path):
    """Head packages are named by the head's weights (and the draft LM head's by its own): a second
    head in the same artefact folder builds its own and drafts what it drafts eagerly."""
    eager = tiny_target("llama")
    trees = []
    for seed in (1, 2):
        target = tiny_target("llama")
        target.steps = CompiledSteps(target, progress=False, autotune=False, folder=tmp_path)
        gen = EagleGenerator(target, random_head(target, seed=seed), "chain:2")
        trees.append(drafted(gen, 12))
        assert trees[-1] == drafted(EagleGenerator(eager, random_head(eager, seed=seed), "chain:2"), 12)
    assert trees[0] != trees[1]
    heads = sorted(p.name for p in tmp_path.glob("step-*-heagle1-*.pt2"))
    scores = sorted(p.name for p in tmp_path.glob("step-*-deagle1-*.pt2"))
    assert len({re.search(r"heagle1-([0-9a-f]{16})", n).group(1) for n in heads}) == 2
    assert scores  # one draft LM head for both: the target's, shared


@needs_cxx
@pytest.mark.parametrize("kind", ["eagle1-vocab", "eagle3"])
def test_compiled_draft_scores_are_the_eager_ones_at_every_shape(kind):
    """The draft LM head's graphs (a reduced EAGLE-1 vocabulary; EAGLE-3's own norm and vocabulary)
    against DraftLM.logprobs, with padded rows and nodes and the wide eager fallback; then the
    trees drafted for three prompts at once equal the eager drafter's: a dynamic tree with the
    reduced vocabulary, EAGLE-1's static tree with EAGLE-3 (each pair builds its own batched
    graphs: the other two pairs would add a minute and cover nothing more)."""
    from test_eagle3 import eagle3_head

    from eaglespec.draft.drafter import Drafter

    target = compiled_target("llama")
    eager = tiny_target("llama")
    vocab = torch.randperm(target.vocab_size, generator=torch.Generator().manual_seed(0))[:40]
    head = eagle3_head(target) if kind == "eagle3" else random_head(target)
    drafter = Drafter(head, target, parse_tree("chain:2"), None if kind == "eagle3" else vocab)
    for b, e in ((1, 1), (3, 5), (2, 17)):
        x = torch.randn(b, e, target.hidden_size, generator=torch.Generator().manual_seed(b * 100 + e), dtype=target.dtype)
        (got, table), want = drafter._draft_logprobs(drafter.new_state(b), x), drafter.lm.logprobs(x)
        assert table is None  # no context tokens yet: the vocabulary's own map
        assert got.shape == want.shape == (b, e, drafter.lm.weight.shape[0])
        assert (got - want).abs().max() <= 1e-5, (b, e)  # log q is float32 on both paths
    tags = {k[3] for k in target.steps._runners if k[2] == 0}
    assert len(tags) == 1 and next(iter(tags)).startswith("d" + head.kind + "-")
    assert {k[:2] for k in target.steps._runners if k[2] == 0} == {(1, 1), (4, 8)}  # (2, 17): eager, wider than 16
    prompts = [PROMPT, [8, 4, 19], [40, 41, 42, 43, 44]]
    tree = "eagle1" if kind == "eagle3" else "dynamic:3,3,8"
    trees = []
    for t in (target, eager):
        gen = EagleGenerator(t, head, tree, draft_vocab=None if kind == "eagle3" else vocab)
        batch, seen = gen.new_batch(), []
        for p in prompts:
            batch.add(p, 10, stops=set())
        while len(batch):
            batch.step(lambda tr, logits, acc: seen.append(tr.tokens.tolist()))
        trees.append(seen)
    assert trees[0] == trees[1], tree


@needs_cxx
def test_warm_builds_the_steps_of_every_cache_size_a_run_needs():
    """`warm(contexts)` (what `eaglespec bench` calls with its prompts' lengths) builds the graphs of
    each cache bucket up front, the target's and the head's (whose cache, like the target's, is
    sized when a sequence joins): a prompt that with its budget needs 1,024 slots then compiles
    nothing inside a timing."""
    target = compiled_target("llama")
    gen = EagleGenerator(target, random_head(target), "chain:2")
    gen.warm(contexts=(40, 100, 600), trees=(parse_tree("chain:2"),))
    assert {k[2] for k in target.steps._runners if k[3] is None} == {512, 1024}
    assert {k[2] for k in target.steps._runners if str(k[3]).startswith("h")} == {512, 1024}  # the head's steps
    built = target.steps.stats.graphs
    long_prompt = [int(i) % 100 + 3 for i in range(500)]
    assert len(ids(gen, 10, prompt=long_prompt)) == 10 and len(ids(gen, 10, speculative=False, prompt=long_prompt)) == 10
    assert target.steps.stats.graphs == built


def test_bench_contexts_bound_every_prompt_of_the_run():
    """What `eaglespec bench` warms: each first turn's prompt + new tokens, and a second turn's
    bound (both user turns and a first answer of the whole budget); nothing on the eager path."""
    from bench_helpers import tiny_generator

    from eaglespec.bench.cli import prompt_contexts
    from eaglespec.bench.datasets import Question

    gen = tiny_generator()
    questions = [Question("1", "c", ("w7 w8 w9", "w10 w11")), Question("2", "c", ("w12",))]
    assert prompt_contexts(gen, questions, 2, "mt-bench", True, 16) == ()  # eager: nothing to build
    gen.target.steps = CompiledSteps(gen.target, progress=False, autotune=False)
    first = len(gen.encode(messages=[{"role": "user", "content": "w7 w8 w9"}]))
    answer = " ".join(["w20"] * 16)  # a first answer of 16 tokens
    second = len(gen.encode(messages=[{"role": "user", "content": "w7 w8 w9"}, {"role": "assistant", "content": answer},
                                      {"role": "user", "content": "w10 w11"}]))
    got = prompt_contexts(gen, questions, 2, "mt-bench", True, 16)
    assert got[0] == first + 16 and got[1] >= second + 16 and len(got) == 3
    assert prompt_contexts(gen, questions, 1, "mt-bench", True, 16)[1] == len(gen.encode(messages=[
        {"role": "user", "content": "w12"}])) + 16


def test_gqa_attention_equals_the_stock_sdpa_attention():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    g = torch.Generator().manual_seed(0)
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 2, True
    query = torch.randn(2, 4, 3, 16, generator=g)
    key, value = torch.randn(2, 2, 10, 16, generator=g), torch.randn(2, 2, 10, 16, generator=g)
    mask = torch.zeros(2, 1, 3, 10)
    mask[0, :, :, 7:] = mask[1, :, 1, :4] = float("-inf")
    ours, _ = compiled.gqa_attention(module, query, key, value, mask, scaling=0.25)
    stock, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
    assert ours.shape == stock.shape == (2, 3, 4, 16)
    torch.testing.assert_close(ours, stock, rtol=0, atol=1e-6)
    assert not torch.equal(ours[:, :, 0], ours[:, :, 2])  # the two query groups read different key heads


def test_gqa_attention_is_set_only_while_a_graph_is_traced(monkeypatch):
    target = tiny_target("qwen2", dtype=torch.float32, check=False)
    calls = []
    real = compiled.gqa_attention
    monkeypatch.setattr(compiled, "gqa_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    prompt = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        before = target.decoder(input_ids=prompt).last_hidden_state
        with compiled._Attention(target.decoder):
            inside = target.decoder(input_ids=torch.tensor([[1, 2, 3, 4]]),
                                    attention_mask=torch.zeros(1, 1, 4, 4).masked_fill(torch.ones(4, 4).triu(1).bool(), float("-inf")))
            assert target.decoder.config._attn_implementation == compiled.GQA_ATTENTION
        assert calls == [1, 1] and target.decoder.config._attn_implementation == "sdpa"
        after = target.decoder(input_ids=prompt).last_hidden_state
    assert calls == [1, 1]
    torch.testing.assert_close(inside.last_hidden_state, before, rtol=0, atol=1e-5)
    torch.testing.assert_close(after, before, rtol=0, atol=0)


def test_cached_step_measurements_are_keyed_on_the_artefact_scheme_and_micro_gemm_block(monkeypatch):
    from eaglespec.engine.target import EagerSteps
    from eaglespec.engine.tuning import cost_key

    target = tiny_target("llama", dtype=torch.float32, check=False)
    gen = EagleGenerator(target, random_head(target), "chain:2")
    eager = cost_key(gen)
    target.steps = CompiledSteps(target, progress=False, autotune=False)
    now = cost_key(gen)
    monkeypatch.setattr(compiled, "ARTEFACT_SCHEME", compiled.ARTEFACT_SCHEME + 1)
    scheme = cost_key(gen)
    monkeypatch.setattr(gemm_kernels, "cpu_gemm_block", lambda: GemmBlock(3))  # and on the micro-GEMM block
    three = cost_key(gen)
    monkeypatch.setattr(gemm_kernels, "cpu_gemm_block", lambda: GemmBlock(3, 16))
    assert len({eager["steps"], now["steps"], scheme["steps"], three["steps"], cost_key(gen)["steps"]}) == 5
    assert eager["steps"] == EagerSteps.kernels


def test_compile_list_and_prune_remove_only_folders_no_start_can_load(tmp_path, monkeypatch, capsys):
    from eaglespec.cli.commands import main
    from eaglespec.engine import compiled_cache

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    monkeypatch.setenv("EAGLESPEC_CACHE", str(tmp_path))
    target = tiny_target("llama")
    current, _ = artefact_dir(target, tmp_path)
    (current / "step.pt2").write_bytes(b"x" * 1000)
    key = json.loads((current / compiled.MANIFEST).read_text())["key"]

    def folder(name, manifest):
        path = tmp_path / "compiled" / name
        (path / "inductor").mkdir(parents=True)
        (path / "inductor" / "kernel.so").write_bytes(b"y" * 500)
        (path / compiled.MANIFEST).write_text(manifest)
        return path

    old_scheme = folder("old-scheme", json.dumps({"key": {**key, "scheme": key["scheme"] - 1}}))
    old_torch = folder("old-torch", json.dumps({"key": {**key, "torch": "2.0.0"}}))
    damaged = folder("damaged", "{not json")
    other_cpu = folder("other-cpu", json.dumps({"key": {**key, "cpu": "Another CPU", "threads": 64}}))
    found = {f.path.name: f for f in compiled_cache.compiled_folders()}
    assert set(found) == {current.name, "old-scheme", "old-torch", "damaged", "other-cpu"}
    assert found[current.name].stale is None and found["other-cpu"].stale is None  # still loadable there
    assert "scheme" in found["old-scheme"].stale and "torch 2.0.0" in found["old-torch"].stale
    assert "unreadable" in found["damaged"].stale and found["old-torch"].bytes >= 500
    assert main(["compile", "--list"]) == 0
    listed = capsys.readouterr().out
    assert "3 stale folder(s)" in listed and "[current]" in listed and listed.count("[stale:") == 3
    assert all(p.exists() for p in (old_scheme, old_torch, damaged))  # --list removes nothing
    # a new folder (a new target here; after an upgrade, the current stack) notes the stale ones
    monkeypatch.setattr(compiled_cache, "NOTE_BYTES", 0)
    _, note = artefact_dir(tiny_target("llama", seed=7), tmp_path)
    assert "compile --prune" in note
    assert main(["compile", "--prune"]) == 0
    assert "removed 3 stale folder(s)" in capsys.readouterr().out
    assert not any(p.exists() for p in (old_scheme, old_torch, damaged))
    assert (current / "step.pt2").is_file() and other_cpu.is_dir()


def test_compile_command_builds_the_batch_buckets_and_refuses_what_builds_nothing(monkeypatch, capsys):
    """`eaglespec compile --max-batch N`: loads the generator (its one-row steps) with the batches
    it tunes for, then warm_batches(N) with progress lines; --compile off and --max-batch 0 are
    one-line errors before anything loads."""
    from eaglespec.cli import commands
    from eaglespec.cli.commands import main

    calls = []

    class FakeGen:
        target = type("T", (), {"steps": type("S", (), {"stats": compiled.CompileStats()})()})()

        def warm_batches(self, max_batch, say=None):
            calls.append(("warm_batches", max_batch))
            say("batch steps for 2 rows ready: 1 step(s) in 0 s")

    def load(args, max_batch=1):
        calls.append(("load", max_batch, args.compile))
        return FakeGen()

    monkeypatch.setattr(commands, "load_generator", load)
    assert main(["compile", "--max-batch", "4"]) == 0
    assert calls == [("load", 4, "on"), ("warm_batches", 4)]
    err = capsys.readouterr().err
    assert "batch steps for 2 rows ready" in err and "compiled steps ready" in err
    assert main(["compile", "--compile", "off"]) == 2 and main(["compile", "--max-batch", "0"]) == 2
    assert "builds nothing" in capsys.readouterr().err and len(calls) == 2
    # a build that fails: one line, with this command's own fix (it refuses --compile off)
    FakeGen.warm_batches = lambda self, max_batch, say=None: (_ for _ in ()).throw(
        compiled.CompileFailed("the target's step", "/cache", OSError(28, "No space left on device")))
    assert main(["compile", "--max-batch", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "no space left on the disk while building the target's step" in err
    assert "free some space and run it again" in err and "runs the eager kernels" not in err


def test_a_second_warm_up_without_vanilla_runs_only_drafting():
    """`warm(vanilla=False)` (a bench's second warm-up, under a tuned variant) runs the trees alone:
    vanilla's runs were the first warm-up's. Both warm-ups run each tree in each cache bucket."""
    import inspect

    target = compiled_target("llama")
    gen = EagleGenerator(target, random_head(target), "chain:2")
    runs, stream = [], gen.stream
    signature = inspect.signature(stream)

    def recorded(*a, **k):
        runs.append(signature.bind(*a, **k).arguments.get("speculative", True))
        return stream(*a, **k)

    gen.stream = recorded
    gen.warm(contexts=(40, 600), vanilla=False)
    assert runs and all(runs)
    drafting = len(runs)
    runs.clear()
    gen.warm(contexts=(40, 600))
    assert runs.count(True) == drafting and runs.count(False) == drafting  # a vanilla run beside each tree's


@pytest.mark.parametrize("rows,prefetch,field", [(0, 0, "rows"), (-4, 0, "rows"), (2.5, 0, "rows"), (True, 0, "rows"),
                                                  (4, -32, "prefetch"), (4, "32", "prefetch"), (4, True, "prefetch")])
def test_a_micro_gemm_block_refuses_what_no_kernel_can_be(rows, prefetch, field):
    """A block of no rows, a negative prefetch distance or a field that is not an int (a bool would
    key its artefacts as "rTrue") names the problem at once, not inside inductor's generated C++."""
    with pytest.raises(ValueError, match=f"micro-GEMM block's {field}"):
        GemmBlock(rows, prefetch)
    assert str(GemmBlock(2, 16)) == "r2-p16" and str(GemmBlock(1)) == "r1"


def test_a_blocks_prefetch_from_some_rows_is_dropped_below_them_and_named_apart():
    """GemmBlock.at_rows(m): the block a graph of m GEMM rows is built with, its name the graph
    cache's key: the prefetch only from prefetch_rows rows on; a block's name tells the rules apart."""
    amd = GemmBlock(4, 32, prefetch_rows=5)
    assert [amd.at_rows(m) for m in (1, 4, 5, 8)] == [GemmBlock(4), GemmBlock(4), GemmBlock(4, 32), GemmBlock(4, 32)]
    assert GemmBlock(4, 32).at_rows(1) == GemmBlock(4, 32) and GemmBlock(4).at_rows(8) == GemmBlock(4)
    assert len({str(amd), str(GemmBlock(4, 32)), str(GemmBlock(4))}) == 3 and str(amd) == "r4-p32-m5"
    assert str(GemmBlock(4, 0, prefetch_rows=5)) == "r4"  # no prefetch: nothing to start anywhere
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match="micro-GEMM block's prefetch_rows"):
            GemmBlock(4, 32, prefetch_rows=bad)
