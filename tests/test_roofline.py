"""The roofline and GEMM commands' pieces, tiny (no timing is asserted)."""

import pytest
import torch
from conftest import tiny_target

from eaglespec.bench import gemm, profile, roofline
from eaglespec.engine import compiled, gemm_kernels
from eaglespec.engine.gemm_kernels import GemmBlock
from eaglespec.engine.target import EagerSteps


def test_weight_bytes_counts_each_matrix_once_and_one_embedding_row():
    """The tiny llama (hidden 64, MLP 128, 2 layers, 4 heads of 16, 2 key heads, vocab 128): a
    layer holds 4,096 + 2 x 2,048 + 4,096 (attention) + 3 x 8,192 (MLP) + 128 (norms) = 36,992
    weights, the final norm 64. Untied: + one embedding row (64) + the LM head (8,192); tied, as
    SmolLM2 is: + the embedding once, whole (8,192), since the LM head reads all of it."""
    target = tiny_target("llama", dtype=torch.float32, check=False)
    body = 2 * 36_992 + 64
    assert roofline.weight_bytes(target) == (body + 64 + 8_192) * 4 == 329_216
    target.lm_head.weight = target.embed_tokens.weight
    assert roofline.weight_bytes(target) == (body + 8_192) * 4 == 328_960


def test_step_times_interleave_the_read_with_the_steps():
    target = tiny_target("llama", dtype=torch.float32, check=False)
    times = roofline.step_times(target, {"eager": EagerSteps(target)}, [1, 2], context=8, rounds=2, read_bytes=1 << 16)
    assert set(times) == {("eager", 1), ("eager", 2), roofline.READ} and all(t > 0 for t in times.values())
    assert roofline.READ not in roofline.step_times(target, {"eager": EagerSteps(target)}, [1], context=8, rounds=1)


@pytest.mark.skipif(compiled.compiler_problem() is not None, reason="inductor's C++ backend cannot build here")
def test_gemm_times_each_micro_gemm_block_and_row_count_and_compares_their_products():
    """bench.gemm: a package per (micro-GEMM block, rows), every one timed; the products of 8 rows
    are bit for bit the same with inductor's blocks, with 4-row blocks and with 2-row blocks that
    prefetch the weights (neither changes a sum's order)."""
    blocks = [None, GemmBlock(4), GemmBlock(2, 8)]
    times, differ = gemm.gemm_times([1, 8], blocks, products=2, shape=(32, 48), rounds=2, say=lambda _: None)
    assert set(times) == {(b, m) for b in blocks for m in (1, 8)} and all(t > 0 for t in times.values())
    assert differ == {1: [], 8: []}


@pytest.mark.skipif(compiled.compiler_problem() is not None, reason="inductor's C++ backend cannot build here")
def test_gemm_times_also_builds_max_autotunes_own_pick_among_all_backends():
    """`--blocks any`: the products as a step wider than CPU_TEMPLATE_ROWS is built
    (max-autotune over every backend), timed beside the templates; its sums may differ."""
    times, differ = gemm.gemm_times([16], [GemmBlock(4), gemm.ANY], products=2, shape=(32, 48), rounds=1, say=lambda _: None)
    assert set(times) == {(GemmBlock(4), 16), (gemm.ANY, 16)} and all(t > 0 for t in times.values())
    assert set(differ) == {16} and set(differ[16]) <= {gemm.ANY}


def test_the_gemm_command_refuses_bad_options_in_one_line_before_building(monkeypatch):
    with pytest.raises(SystemExit, match="--blocks 'inductor,x': give 'inductor', 'any', a positive number of register rows"):
        gemm.main(["--register-rows", "inductor,x"])
    with pytest.raises(SystemExit, match="--blocks '2p': give"):
        gemm.main(["--blocks", "2p"])
    assert gemm._blocks("inductor,4,2p32,r4-p16,any,4p32m5,r4-p32-m5") == [None, GemmBlock(4), GemmBlock(2, 32), GemmBlock(4, 16),
                                                                        gemm.ANY, GemmBlock(4, 32, 5), GemmBlock(4, 32, 5)]
    with monkeypatch.context() as m:  # a torch whose template takes no prefetch
        m.setattr(gemm_kernels, "prefetch_line", lambda: None)
        with pytest.raises(SystemExit, match="--blocks '4,2p32': this torch's micro-GEMM template has no line"):
            gemm.main(["--blocks", "4,2p32"])
    with pytest.raises(SystemExit, match="--rows '0,8' / --shape '576x1536': give positive numbers"):
        gemm.main(["--rows", "0,8"])
    with pytest.raises(SystemExit, match="--rounds 0 / --products 120: give at least 1"):
        gemm.main(["--rounds", "0"])


def test_the_gemm_command_names_the_blocks_whose_products_differ(monkeypatch, capsys):
    monkeypatch.setattr(gemm, "gemm_times", lambda rows, blocks, *a, **k: (
        {(b, m): 0.01 * m for b in blocks for m in rows}, {1: [], 8: [gemm.ANY]}))
    assert gemm.main(["--rows", "1,8", "--blocks", "inductor,2p32,any"]) == 0
    out = capsys.readouterr().out
    assert "products bit for bit the same as inductor's: m=1 yes, m=8 NO, any" in out and "\nr2-p32 " in out


def test_profile_kinds_name_inductors_kernels_and_an_events_own_time_goes_to_its_step_and_nearest_kind():
    from types import SimpleNamespace as Ev

    assert profile.kind_of("graph_0_gemm_m1n64k64_kernel") == "GEMMs" == profile.kind_of("mkldnn::_linear_pointwise")
    assert profile.kind_of("graph_0_cpp_fused__scaled_dot_product_flash_attention_for_cpu_3") == "fused loops"
    assert profile.kind_of("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"
    assert profile.kind_of("## Call CompiledFxGraph fabc ##") == "graph glue"
    assert profile.kind_of("aten::empty_like") is None
    step1, step4 = (Ev(name=f"{profile._MARK}{q}", self_cpu_time_total=1.0, cpu_parent=None) for q in (1, 4))
    glue = Ev(name="Torch-Compiled Region: 0/0", self_cpu_time_total=5.0, cpu_parent=step1)
    sdpa = Ev(name="aten::_scaled_dot_product_flash_attention_for_cpu", self_cpu_time_total=30.0, cpu_parent=glue)
    inside = Ev(name="aten::empty_like", self_cpu_time_total=2.0, cpu_parent=sdpa)
    alone = Ev(name="aten::cat", self_cpu_time_total=7.0, cpu_parent=step1)
    gemm = Ev(name="graph_1_gemm_m4n64k64_kernel", self_cpu_time_total=11.0, cpu_parent=step4)
    stray = Ev(name="aten::add", self_cpu_time_total=50.0, cpu_parent=None)
    found = profile.breakdown([step1, glue, sdpa, inside, alone, step4, gemm, stray])
    assert set(found) == {1, 4}
    kinds, names = found[1]
    assert kinds == {"GEMMs": 0.0, "attention": 32.0, "fused loops": 0.0, "graph glue": 5.0, "outside the graph": 8.0}
    assert names["aten::empty_like"] == 2.0 and "graph_1_gemm_m4n64k64_kernel" not in names
    assert found[4][0]["GEMMs"] == 11.0 and found[4][0]["outside the graph"] == 1.0


@pytest.mark.skipif(compiled.compiler_problem() is not None, reason="inductor's C++ backend cannot build here")
def test_profile_steps_splits_a_compiled_steps_time_into_kinds(monkeypatch):
    import torch._inductor.config as inductor_config

    monkeypatch.setattr(inductor_config.cpp, "enable_kernel_profile", True)
    target = tiny_target("llama", dtype=torch.float32, check=False)
    backend = compiled.CompiledSteps(target, autotune=False, progress=False)
    result, floor = profile.profile_steps(target, backend, [1, 2], context=8, rounds=2, read_bytes=1 << 16)
    assert set(result) == {1, 2} and floor > 0
    for r in result.values():
        assert r.wall > 0 and set(r.kinds) == set(profile.KINDS)
        assert r.kinds["GEMMs"] > 0 and r.kinds["attention"] > 0 and r.kinds["fused loops"] > 0
        assert any(name.startswith("graph_") for name in r.names)  # inductor's kernels were recorded


def test_the_profile_command_refuses_bad_options_in_one_line_before_loading():
    with pytest.raises(SystemExit, match="--tokens '1,x': give positive whole numbers"):
        profile.main(["--tokens", "1,x"])
    with pytest.raises(SystemExit, match="--tokens '1,3': a compiled step runs"):
        profile.main(["--tokens", "1,3"])
    with pytest.raises(SystemExit, match="--rounds 0"):
        profile.main(["--rounds", "0"])


def test_the_roofline_command_refuses_bad_options_in_one_line_before_loading():
    with pytest.raises(SystemExit, match="--tokens '0,4': give positive whole numbers"):
        roofline.main(["--tokens", "0,4"])
    with pytest.raises(SystemExit, match="--rounds 0: give at least 1"):
        roofline.main(["--rounds", "0"])
