"""Numerics: the batch-invariance measurement, dtype 'auto', and the weight-only int8 target
(whose EAGLE output equals its own vanilla decoding; activation quantization is refused)."""

import pytest
import torch
from conftest import tiny_target
from test_decoding import PROMPT, random_head

from eaglespec.engine import numerics
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.engine.numerics import Invariance, NumericsReport, check_dtype_runs, choose_dtype, measure_invariance
from eaglespec.engine.quant import Int8WeightOnlyLinear, quantize_target
from eaglespec.errors import EagleError

SIZES = (1, 2, 4, 8)


def test_step_times_are_measured_side_by_side():
    targets = {"float32": tiny_target("llama", dtype=torch.float32), "float64": tiny_target("llama")}
    times = numerics.step_times(targets, context=8, reps=2)
    assert set(times) == set(targets) and all(0 < t < 10 for t in times.values())


def test_fp32_verification_is_exact_up_to_summation_order():
    report = measure_invariance(tiny_target("llama", dtype=torch.float32), SIZES, context=32)
    assert [r.size for r in report.rows] == list(SIZES)
    assert report.rows[0].bitwise  # one token is one token
    assert all(r.exact and r.argmax_agrees and r.max_diff < 1e-3 for r in report.rows)
    assert report.largest_exact() == 8


class BatchScaledLinear(torch.nn.Module):
    """Dynamic activation quantization: one int8 scale from the max of the whole input (all rows)."""

    def __init__(self, linear):
        super().__init__()
        self.linear = linear

    def forward(self, x):
        scale = x.abs().max().clamp(min=1e-8) / 127
        return self.linear((x / scale).round().clamp(-128, 127) * scale)


def test_activation_quantization_is_not_batch_invariant_and_is_refused():
    target = tiny_target("llama", dtype=torch.float32)
    for module in list(target.decoder.modules()):
        for name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(module, name, BatchScaledLinear(child))
    report = measure_invariance(target, SIZES, context=32)
    assert report.rows[0].exact
    assert not all(r.exact for r in report.rows[1:])  # rows depend on each other through the scale
    assert report.largest_exact() < 8
    with pytest.raises(EagleError, match="cannot be a lossless verifier"):
        quantize_target(target, "int8-dynamic")


def test_an_int8_weight_only_target_is_its_own_lossless_verifier():
    target = tiny_target("llama", dtype=torch.float32)
    reference = target.model.model.layers[0].self_attn.q_proj.weight.detach().clone()
    assert quantize_target(target, "int8") == 2 * 7  # q, k, v, o, gate, up, down per layer
    q = target.model.model.layers[0].self_attn.q_proj
    assert isinstance(q, Int8WeightOnlyLinear) and q.weight_int8.dtype == torch.int8
    dequantized = q.weight_int8.float() * q.scales[:, None]
    assert (dequantized - reference).abs().max() <= q.scales.max() / 2 + 1e-6  # round to nearest
    target.check_tree_forward()
    assert measure_invariance(target, SIZES, context=32).largest_exact() == 8
    for tree in ("eagle1", "dynamic:3,4,10"):
        gen = EagleGenerator(target, random_head(target), tree)
        vanilla = gen.generate(input_ids=PROMPT, max_new_tokens=40, speculative=False, stop_token_ids=set())
        eagle = gen.generate(input_ids=PROMPT, max_new_tokens=40, stop_token_ids=set())
        assert eagle.token_ids == vanilla.token_ids
        assert all(s.tree_size > 1 for s in eagle.steps[:-1])


def test_dtypes_the_hardware_cannot_run_are_refused(monkeypatch):
    with pytest.raises(EagleError, match="needs a GPU"):
        check_dtype_runs("float16", "cpu")
    monkeypatch.setattr("eaglespec.engine.target.native_bf16_cpu", lambda: False)
    with pytest.raises(EagleError, match="no native bf16"):
        check_dtype_runs("bfloat16", "cpu")
    check_dtype_runs("float32", "cpu")
    with pytest.raises(EagleError, match="choose auto"):
        numerics.parse_dtype("int4")


def _report(dtype, exact_up_to):
    rows = tuple(Invariance(q, 0.0 if q <= exact_up_to else 0.5, True, q <= exact_up_to, 10.0) for q in SIZES)
    return NumericsReport(dtype, rows)


@pytest.mark.parametrize("bf16_exact, bf16_step, chosen", [(4, 0.01, "bfloat16"), (1, 0.01, "float32"),
                                                          (8, 0.05, "float32")])
def test_dtype_auto_takes_the_fastest_with_exact_trees(monkeypatch, bf16_exact, bf16_step, chosen):
    monkeypatch.setattr("eaglespec.engine.target.native_bf16_cpu", lambda: True)
    fake = {"float32": _report("float32", 8), "bfloat16": _report("bfloat16", bf16_exact)}
    times = {"float32": 0.02, "bfloat16": bf16_step}
    monkeypatch.setattr(numerics, "numerics_for", lambda t, **kw: fake[str(t.dtype).removeprefix("torch.")])
    monkeypatch.setattr(numerics, "step_times", lambda targets: {n: times[n] for n in targets})
    target, report, why = choose_dtype(tiny_target("llama", dtype=torch.float32), "cpu")
    assert str(target.dtype) == f"torch.{chosen}" and report.dtype == chosen
    assert why.startswith(f"dtype auto: {chosen}") and "exact up to" in why


def test_auto_tree_keeps_to_exact_sizes(tmp_path, monkeypatch):
    from eaglespec.engine.tuning import AcceptanceStats, use_auto_tree

    target = tiny_target("llama")
    head_dir = tmp_path / "head"
    head = random_head(target)
    head.save_pretrained(head_dir)
    AcceptanceStats(tuple((0.9, 0.5) for _ in range(6)), steps=1).save(head_dir)
    gen = EagleGenerator(target, head, "eagle1", head_dir=head_dir)
    use_auto_tree(gen, max_tokens=4)
    assert gen.tree.num_nodes <= 4 and "do not verify exactly" in gen.tuned.describe()
    use_auto_tree(gen, max_tokens=1)
    assert gen.tree is None and "no drafts" in gen.head_note


def test_the_formats_table_runs_every_format_side_by_side():
    from eaglespec.bench.dtypes import markdown, run

    fp32 = tiny_target("llama", dtype=torch.float32)
    int8 = tiny_target("llama", dtype=torch.float32)
    quantize_target(int8, "int8")
    gens = {"fp32": EagleGenerator(fp32, random_head(fp32), "chain:2"),
            "int8": EagleGenerator(int8, random_head(int8), "chain:2")}
    rows = run([PROMPT, PROMPT[:4]], gens, max_new_tokens=8)
    assert [(r["format"], r["method"]) for r in rows] == [("fp32", "vanilla"), ("fp32", "eagle"),
                                                          ("int8", "vanilla"), ("int8", "eagle")]
    assert rows[0]["speedup_vs_fp32_vanilla"] == 1.0 and rows[1]["identical"] == "2/2" and rows[3]["identical"] == "2/2"
    meta = {"command": "x", "cpu": "c", "threads": 1, "prompts": 2, "max_new_tokens": 8}
    assert "| int8 | eagle |" in markdown(rows, meta)


def test_tree_limit_is_none_only_where_every_measured_size_is_exact():
    row = lambda q, exact: Invariance(q, 0.0 if exact else 1.0, True, exact)  # noqa: E731
    assert NumericsReport("float32", (row(1, True), row(2, True), row(4, True), row(8, True))).tree_limit() is None
    assert NumericsReport("float32", (row(1, True), row(2, True), row(4, False), row(8, True))).tree_limit() == 2
    assert NumericsReport("bfloat16", (row(1, True), row(2, False))).tree_limit() == 1


class RoundingSteps:
    """Stands in for compiled kernels that round a q-token step otherwise than a single-token one
    (as bf16 GEMMs blocked by the row count do): a q > 1 step's logits move by 1% of their scale."""

    name = kernels = "rounding-test-kernels"
    builds_steps = True
    invariance_sizes = (1, 2, 4, 8)
    rounds_from = 2  # the smallest q whose step rounds otherwise

    def __init__(self, target):
        from eaglespec.engine.target import EagerSteps

        self.eager = EagerSteps(target)

    def __getattr__(self, name):
        return getattr(self.eager, name)

    @staticmethod
    def cache_bucket(slots):
        return 512

    def verify_rows(self, input_ids, rows, tree_mask, positions, sizes, layers=None):
        states, logits = self.eager.verify_rows(input_ids, rows, tree_mask, positions, sizes, layers)
        return states, [x + 0.01 * x.abs().max() if x.shape[0] >= self.rounds_from else x for x in logits]


def test_auto_trees_are_gated_by_the_kernels_that_verify_them(tmp_path, monkeypatch):
    """dtype and trees were once checked on the eager kernels before the compiled step was put in:
    a compiled step that rounds q-token steps otherwise would have verified trees inexactly."""
    from conftest import tiny_model
    from tiny_tokenizer import tiny_tokenizer

    from eaglespec.core.config import parse_tree
    from eaglespec.draft.head import EagleHead
    from eaglespec.draft.vocab import save_draft_vocab
    from eaglespec.engine import compiled
    from eaglespec.engine.tuning import AcceptanceStats

    tok = tiny_tokenizer()
    model = tiny_model("llama", vocab_size=len(tok), dtype=torch.float32)
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    EagleHead(model.config).save_pretrained(tmp_path / "head")
    save_draft_vocab(tmp_path / "head", torch.arange(len(tok)))
    AcceptanceStats(((0.9, 0.5), (0.9, 0.5)), steps=10).save(tmp_path / "head")

    def load(compile):  # dtype auto measures the eager kernels (fp32 only: no bf16 candidate)
        return EagleGenerator.from_pretrained(str(tmp_path / "model"), str(tmp_path / "head"), "auto",
                                              dtype="auto", compile=compile)

    monkeypatch.setattr("eaglespec.engine.target.native_bf16_cpu", lambda: False)
    assert load("off").tree is not None  # eager fp32: trees verify exactly

    def rounding(target, mode="auto", progress=True, tokens=None, rows=None):
        target.steps = RoundingSteps(target)
        return "rounding test kernels"

    monkeypatch.setattr(compiled, "use_compiled", rounding)
    gen = load("on")
    assert isinstance(gen.target.steps, RoundingSteps)
    assert gen.tree is None and "rounding-test-kernels kernels no tree verifies exactly" in gen.head_note
    assert [r.exact for r in gen.numerics.rows] == [True, False, False, False]
    # exact up to the query buckets --tree auto measures: tuned trees are free, and a head without
    # acceptance.json gets EAGLE-1's tree (26 tokens) only once that size too is measured exact
    monkeypatch.setattr(RoundingSteps, "rounds_from", 9)
    monkeypatch.setenv("EAGLESPEC_RETUNE", "1")
    gen = load("on")
    assert gen.tree is not None and gen.numerics.tree_limit() is None
    (tmp_path / "head" / "acceptance.json").unlink()
    eagle1 = parse_tree("eagle1")
    gen = load("on")
    assert [r.size for r in gen.numerics.rows] == [1, 2, 4, 8, eagle1.num_nodes + 1]
    assert gen.numerics.tree_limit() == 8
    assert gen.tree is None and "EAGLE-1's tree does not verify exactly" in gen.head_note
    monkeypatch.setattr(RoundingSteps, "rounds_from", eagle1.num_nodes + 2)
    assert load("on").tree.paths == eagle1.paths  # every measured size exact: EAGLE-1's tree


def test_an_untuned_head_gets_eagle1s_tree_only_where_it_verifies_exactly():
    from eaglespec.core.config import parse_tree
    from eaglespec.engine.tuning import use_auto_tree

    target = tiny_target("llama", dtype=torch.float32)
    gen = EagleGenerator(target, random_head(target), "eagle1")  # no head folder: no acceptance.json
    use_auto_tree(gen)
    assert gen.tree.paths == parse_tree("eagle1").paths and "no acceptance.json" in gen.head_note
    gen.head_note = ""
    use_auto_tree(gen, max_tokens=8)  # trees of more than 8 tokens measured inexact
    assert gen.tree is None and "EAGLE-1's tree does not verify exactly" in gen.head_note


class SiblingRoundingSteps(RoundingSteps):
    """Stands in for kernels that verify a chain exactly but round a sibling otherwise (bf16 on the
    Intel AMX kind: a draft tree's second child, one slot further from its parent than when
    decoded alone, differed by up to 0.37 in SmolLM2's logits), and only at some cache lengths."""

    odd_lengths_only = False

    def verify_rows(self, input_ids, rows, tree_mask, positions, sizes, layers=None):
        start = rows.length
        states, logits = self.eager.verify_rows(input_ids, rows, tree_mask, positions, sizes, layers)
        n = input_ids.shape[1]
        # a row whose slot is further from the start than its depth: a sibling placed after another
        moved = (torch.arange(n) > positions[0].cpu()).tolist()
        if self.odd_lengths_only and start % 2 == 0:
            return states, logits
        return states, [x + 0.01 * x.abs().max() * torch.tensor(moved[:x.shape[0]])[:, None] for x in logits]


@pytest.mark.parametrize("odd_lengths_only", [False, True])
def test_siblings_are_measured_as_well_as_chains_at_several_cache_lengths(odd_lengths_only, monkeypatch):
    """A chain alone never places a token further from its parent than when decoded alone; a draft
    tree's siblings do. Kernels that round those rows otherwise, at any of several cache lengths,
    make every size of 3 tokens or more inexact (2 tokens: the star is the chain)."""
    target = tiny_target("llama", dtype=torch.float32)
    steps = SiblingRoundingSteps(target)
    monkeypatch.setattr(SiblingRoundingSteps, "odd_lengths_only", odd_lengths_only)
    target.steps = steps
    report = measure_invariance(target, (1, 2, 3, 4), context=32)
    assert [r.exact for r in report.rows] == [True, True, False, False] and report.largest_exact() == 2
    if odd_lengths_only:  # one cache length would have missed it
        assert all(r.exact for r in measure_invariance(target, (1, 2, 3, 4), context=32, offsets=(0,)).rows)


def test_the_table_command_answers_help_and_a_compile_it_cannot_run_before_measuring(monkeypatch, capsys):
    """`python -m eaglespec.engine.numerics --help` prints its options (it once started the
    minutes-long measurement); --compile on without a C++ compiler is one line before any model loads."""
    from eaglespec.engine import compiled, target

    monkeypatch.setattr(target, "load_target", lambda *a, **k: pytest.fail("loaded a model"))
    with pytest.raises(SystemExit) as done:
        numerics.main(["--help"])
    assert done.value.code == 0 and "--compile {auto,on,off}" in capsys.readouterr().out
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(compiled.shutil, "which", lambda name: None)
    with pytest.raises(SystemExit) as done:
        numerics.main(["--compile", "on"])
    assert "--compile on: no C++ compiler" in str(done.value.code) and "\n" not in str(done.value.code)


def test_numerics_fors_cache_follows_the_cache_lengths_measured(monkeypatch):
    """numerics_for's cached report names the cache lengths it was measured after (CONTEXT_OFFSETS,
    read at the call): a report of one length, as the one_cache_length fixture measures, is never
    read back for the eight."""
    target = tiny_target("llama", dtype=torch.float32)
    lengths: list[int] = []
    measured_at = numerics._invariance_at

    def counting(target, prefix, *args):
        lengths.append(prefix.shape[1])
        return measured_at(target, prefix, *args)

    monkeypatch.setattr(numerics, "_invariance_at", counting)
    with monkeypatch.context() as m:
        m.setattr(numerics, "CONTEXT_OFFSETS", numerics.CONTEXT_OFFSETS[:1])
        numerics.numerics_for(target, sizes=(1, 2))
        numerics.numerics_for(target, sizes=(1, 2))  # read back
    assert len(lengths) == 1
    numerics.numerics_for(target, sizes=(1, 2))  # all eight: measured, not the one-length report
    assert len(lengths) == 1 + len(set(numerics.CONTEXT_OFFSETS))
