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
