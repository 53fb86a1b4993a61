"""llama.cpp runs our EAGLE-3 head (issue 11): the GGUF `export_llamacpp` writes holds what
llama.cpp's EAGLE-3 loader reads, and llama-server's greedy output with the head as its draft equals
its output without a draft, with the acceptance reported.

The tests marked `interop` build llama.cpp from PyPI's source first (`make interop-test`; the
first build takes tens of minutes on 2 cores, later runs reuse it); `make test` skips them. The
EAGLE-1 refusal needs neither the build nor the converter and runs with every `make test`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import eaglespec
from eaglespec.errors import EagleError
from eaglespec.interop import build_llamacpp
from eaglespec.interop.llamacpp import LlamaServer, export_llamacpp

HEADS = Path(eaglespec.__file__).parent / "heads"
EAGLE3_HEAD = HEADS / "smollm2-135m-instruct-eagle3"
EAGLE1_HEAD = HEADS / "smollm2-135m-instruct"
PROMPTS = (
    "Explain in a few sentences why the sky is blue.",
    "Write a short poem about a river in winter.",
    "List three uses of a paperclip, one per line.",
    "What is the capital of France? Answer in one sentence, then say why it matters.",
)
N_PREDICT = 64
N_DRAFT = 3


def test_an_eagle1_head_is_refused_and_nothing_written(tmp_path):
    with pytest.raises(EagleError, match="llamacpp format holds EAGLE-3 heads only"):
        export_llamacpp(EAGLE1_HEAD, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def built() -> Path:
    """llama-server, built if it is not yet (idempotent: a few seconds when it is)."""
    return build_llamacpp.build()["llama-server"]


@pytest.fixture(scope="module")
def draft_gguf(built, tmp_path_factory) -> Path:
    files = export_llamacpp(EAGLE3_HEAD, tmp_path_factory.mktemp("draft"))
    assert len(files) == 1 and files[0].suffix == ".gguf"
    return files[0]


@pytest.fixture(scope="module")
def prompt_ids() -> list[list[int]]:
    """The prompts through SmolLM2's chat template, as eaglespec encodes them."""
    from transformers import AutoTokenizer

    from eaglespec.engine.prompts import encode_chat
    from eaglespec.engine.target import default_gguf_path

    gguf = default_gguf_path()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    return [encode_chat(tok, [{"role": "user", "content": p}]) for p in PROMPTS]


@pytest.mark.interop
def test_the_gguf_holds_what_llamacpps_eagle3_loader_reads(draft_gguf):
    """The keys and tensors src/models/eagle3.cpp (build 11434) loads, with our head's values:
    the layer ids in our indexing (llama.cpp extracts layer inputs too), d2t as absolute target
    ids, the weights exact, the target's tokenizer, and no embedding (it reads the target's)."""
    from gguf import GGUFReader

    from eaglespec.draft.contract import read_head_files

    cfg, sd, _ = read_head_files(EAGLE3_HEAD)
    reader = GGUFReader(draft_gguf)
    fields = {name: f.contents() for name, f in reader.fields.items()
              if name.split(".")[-1] not in ("tokens", "token_type", "merges")}
    tensors = {t.name: t for t in reader.tensors}
    assert fields["general.architecture"] == "eagle3"
    assert fields["eagle3.target_layers"] == cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    assert fields["eagle3.target_hidden_size"] == 576
    assert fields["eagle3.norm_before_residual"] is False and fields["eagle3.norm_before_fc"] is False
    assert fields["eagle3.block_count"] == 1
    assert fields["eagle3.rope.freq_base"] == pytest.approx(100000.0)  # the target's, not 10000
    assert fields["eagle3.attention.head_count"] == 9 and fields["eagle3.attention.head_count_kv"] == 3
    assert fields["tokenizer.ggml.model"] == "gpt2" and fields["tokenizer.ggml.pre"] == "smollm"
    assert len(reader.fields["tokenizer.ggml.tokens"].data) == 49152
    assert "token_embd.weight" not in tensors and "t2d" not in tensors

    d2t = np.asarray(tensors["d2t"].data)
    assert d2t.dtype == np.int64
    np.testing.assert_array_equal(d2t, sd["d2t"].numpy() + np.arange(8192))
    for ours, theirs in (("fc.weight", "fc.weight"), ("lm_head.weight", "output.weight"),
                         ("norm.weight", "output_norm.weight"),
                         ("midlayer.hidden_norm.weight", "blk.0.attn_norm_2.weight"),
                         ("midlayer.input_layernorm.weight", "blk.0.attn_norm.weight"),
                         ("midlayer.self_attn.v_proj.weight", "blk.0.attn_v.weight"),
                         ("midlayer.mlp.down_proj.weight", "blk.0.ffn_down.weight")):
        np.testing.assert_array_equal(np.asarray(tensors[theirs].data), sd[ours].float().numpy(), err_msg=theirs)


@pytest.mark.interop
def test_llama_server_greedy_with_our_draft_equals_without(built, draft_gguf, prompt_ids, tmp_path):
    from eaglespec.engine.target import default_gguf_path

    target = default_gguf_path()  # the Q4_1 GGUF llama.cpp runs as is
    # one thread: llama.cpp's threads spin at every barrier, which on a shared CPU costs seconds a
    # token; the outputs compared here come from the same thread count either way
    with LlamaServer(target, threads=1, binary=built, log=tmp_path / "vanilla.log") as srv:
        vanilla = [srv.complete(ids, N_PREDICT) for ids in prompt_ids]
    with LlamaServer(target, draft_gguf, n_draft=N_DRAFT, threads=1, binary=built,
                     log=tmp_path / "eagle3.log") as srv:
        drafted = [srv.complete(ids, N_PREDICT) for ids in prompt_ids]

    for prompt, v, d in zip(PROMPTS, vanilla, drafted):
        assert v.token_ids, f"llama.cpp generated nothing for {prompt!r}"
        at = next((i for i, (a, b) in enumerate(zip(v.token_ids, d.token_ids)) if a != b),
                  None if len(v.token_ids) == len(d.token_ids) else min(len(v.token_ids), len(d.token_ids)))
        assert at is None, (f"{prompt!r}: with the EAGLE-3 draft llama.cpp differs from itself without one at "
                            f"token {at}: {d.text!r} vs {v.text!r}")
        assert v.drafted == v.steps == 0
        # acceptance is reported, per request, by /metrics and in the server's log
        assert d.steps > 0 and d.steps <= d.drafted <= N_DRAFT * d.steps and 0 <= d.accepted <= d.drafted
        assert d.decodes >= d.steps + 1  # the prefill, a forward per verification step, one per step without a draft
    accepted, proposed = sum(d.accepted for d in drafted), sum(d.drafted for d in drafted)
    # this head is accepted ~10% a token in llama.cpp; with a d2t that maps draft ids to the wrong
    # target tokens 0%. (Layer ids shifted by one or RoPE base 10000 instead of 100000 moved it by
    # under a point on 3 MT-bench prompts: the field test above pins those.)
    assert accepted / proposed > 0.05, f"llama.cpp accepted {accepted}/{proposed} draft tokens of our head"
    assert "draft acceptance" in (tmp_path / "eagle3.log").read_text(errors="replace")


@pytest.mark.interop
def test_the_f32_copy_holds_the_dequantized_values(built):
    """llama-quantize's F32 copy of the packaged Q4_1 GGUF holds, tensor for tensor, what gguf-py's
    dequantization (the one transformers loads the target with) gives: the weights eaglespec runs."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    from eaglespec.engine.target import default_gguf_path
    from eaglespec.interop.llamacpp import f32_gguf

    source = default_gguf_path()
    copy = f32_gguf(source)
    quantized = {t.name: t for t in GGUFReader(source).tensors}
    full = {t.name: t for t in GGUFReader(copy).tensors}
    assert set(full) == set(quantized)
    assert {t.tensor_type.name for t in full.values()} == {"F32"}
    for name, t in quantized.items():
        ours = dequantize(t.data, t.tensor_type).reshape(-1)
        np.testing.assert_array_equal(np.asarray(full[name].data, dtype=np.float32).reshape(-1), ours, err_msg=name)


@pytest.mark.interop
def test_bench_runs_llamacpp_beside_our_loop(built, tmp_path, monkeypatch):
    """`eaglespec bench --methods vanilla,llama.cpp,llama.cpp-f32`: one table, llama.cpp's rows
    from its own servers; the F32 copy greedy-decodes what our fp32 vanilla does."""
    import json

    from eaglespec.cli.commands import main

    monkeypatch.setenv("EAGLESPEC_COMPILE", "off")
    out = tmp_path / "bench"
    assert main(["bench", "--dataset", "mt-bench", "--limit", "2", "--max-new-tokens", "24", "--no-plots",
                 "--methods", "vanilla,llama.cpp,llama.cpp-f32", "--out", str(out)]) == 0
    report = json.loads((out / "results.json").read_text())
    by_method = {}
    for e in report["records"]:
        by_method.setdefault(e["method"], []).append(e)
    assert set(by_method) == {"vanilla", "llama.cpp", "llama.cpp-f32"}
    for name in ("llama.cpp", "llama.cpp-f32"):
        assert all(e["token_ids"] for e in by_method[name]), name
    assert [e["token_ids"] for e in by_method["llama.cpp-f32"]] == [e["token_ids"] for e in by_method["vanilla"]]
    assert "llama.cpp-f32" in (out / "results.md").read_text()
