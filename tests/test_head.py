"""The EAGLE-1 head: architecture, checkpoint names, loading checks."""

import json

import pytest
import torch
from conftest import ARCHS, tiny_config
from safetensors.torch import load_file, save_file

from eaglespec.draft.head import EagleHead
from eaglespec.errors import EagleError

EAGLE1_KEYS = {
    "fc.weight", "fc.bias",
    "layers.0.self_attn.q_proj.weight", "layers.0.self_attn.k_proj.weight",
    "layers.0.self_attn.v_proj.weight", "layers.0.self_attn.o_proj.weight",
    "layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight", "layers.0.mlp.down_proj.weight",
    "layers.0.post_attention_layernorm.weight",
}


def test_llama_head_has_the_published_eagle1_names(tmp_path):
    cfg = tiny_config("llama")
    head = EagleHead(cfg)
    head.save_pretrained(tmp_path, extra={"note": "x"})
    sd = load_file(tmp_path / "model.safetensors")
    assert set(sd) == EAGLE1_KEYS
    assert sd["fc.weight"].shape == (64, 128) and sd["fc.bias"].shape == (64,)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["num_hidden_layers"] == 1 and saved["hidden_size"] == 64 and saved["eaglespec"] == {"note": "x"}
    assert saved["architectures"] == ["LlamaForCausalLM"] and saved["tie_word_embeddings"] is False
    # with an fc bias, `bias` is left out: the official code reads a missing one as true, while vLLM and
    # SGLang read `bias: true` as attention bias (docs/interop.md)
    assert "bias" not in saved and saved["attention_bias"] is False


def test_the_saved_config_has_nothing_a_reader_can_misread(tmp_path):
    """The target's quantization_config (a GGUF target) would make vLLM and SGLang load the head
    as a quantised model; rope_theta is read at the top level by the official code (10000
    without it); a tied embedding makes SGLang use it as the head's LM head; no machine paths."""
    cfg = tiny_config("llama")
    cfg.quantization_config = {"quant_method": "gguf", "gguf_file": "x.gguf", "dequantize": False}
    cfg.tie_word_embeddings = True
    cfg.rope_parameters = {"rope_type": "default", "rope_theta": 100000.0}
    cfg._name_or_path = "someone/model-x"  # what from_pretrained records; a reader must not see it
    EagleHead(cfg).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert "quantization_config" not in saved and "_name_or_path" not in saved
    assert saved["rope_theta"] == 100000.0 and saved["rope_parameters"]["rope_theta"] == 100000.0
    assert saved["rope_scaling"] is None and saved["tie_word_embeddings"] is False
    assert saved["torch_dtype"] == saved["dtype"] == "float32"


def test_a_head_without_fc_bias(tmp_path):
    """--no-fc-bias (the LLaMA-3 releases, vLLM's EAGLE-1): no fc.bias tensor, `bias: false`, and it
    loads back without one; an official head with `bias: false` loads (it used to be refused)."""
    cfg = tiny_config("llama")
    torch.manual_seed(0)
    head = EagleHead(cfg, fc_bias=False)
    head.save_pretrained(tmp_path)
    assert set(load_file(tmp_path / "model.safetensors")) == EAGLE1_KEYS - {"fc.bias"}
    assert json.loads((tmp_path / "config.json").read_text())["bias"] is False
    again = EagleHead.from_pretrained(tmp_path, cfg)
    assert again.fc.bias is None
    embeds, feats = torch.randn(1, 5, 64), torch.randn(1, 5, 64)
    torch.testing.assert_close(head(embeds, feats), again(embeds, feats))


def test_train_config_has_the_fc_bias_switch():
    from eaglespec.train.config import TrainConfig, add_config_arguments, config_from_args

    import argparse

    parser = argparse.ArgumentParser()
    add_config_arguments(parser, TrainConfig)
    assert config_from_args(TrainConfig, parser.parse_args([])).fc_bias is True
    assert config_from_args(TrainConfig, parser.parse_args(["--no-fc-bias"])).fc_bias is False


@pytest.mark.parametrize("arch", ARCHS)
def test_round_trip_and_forward(arch, tmp_path):
    cfg = tiny_config(arch)
    torch.manual_seed(0)
    head = EagleHead(cfg)
    head.save_pretrained(tmp_path)
    again = EagleHead.from_pretrained(tmp_path, cfg)
    embeds, feats = torch.randn(1, 5, 64), torch.randn(1, 5, 64)
    torch.testing.assert_close(head(embeds, feats), again(embeds, feats))
    # no input norm on the layer, no final norm: the two norms that EAGLE removes are gone
    assert isinstance(head.decoder.layers[0].input_layernorm, torch.nn.Identity)
    assert isinstance(head.decoder.norm, torch.nn.Identity)


def test_head_is_causal():
    head = EagleHead(tiny_config("llama"))
    embeds, feats = torch.randn(1, 6, 64), torch.randn(1, 6, 64)
    full = head(embeds, feats)
    prefix = head(embeds[:, :3], feats[:, :3])
    torch.testing.assert_close(full[:, :3], prefix)


def test_missing_and_malformed_head_dirs(tmp_path):
    cfg = tiny_config("llama")
    with pytest.raises(EagleError, match="does not exist"):
        EagleHead.from_pretrained(tmp_path / "missing", cfg)
    with pytest.raises(EagleError, match="no config.json"):
        EagleHead.from_pretrained(tmp_path, cfg)
    (tmp_path / "config.json").write_text("{not json")
    (tmp_path / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(EagleError, match="not valid JSON"):
        EagleHead.from_pretrained(tmp_path, cfg)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(EagleError, match="not a readable weights file"):
        EagleHead.from_pretrained(tmp_path, cfg)


def test_head_for_another_target_is_refused(tmp_path):
    EagleHead(tiny_config("llama", hidden_size=32)).save_pretrained(tmp_path)
    with pytest.raises(EagleError, match="hidden_size=32"):
        EagleHead.from_pretrained(tmp_path, tiny_config("llama"))
    # same sizes in config.json but wrong tensor shapes
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["hidden_size"] = 64
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(EagleError, match="shape"):
        EagleHead.from_pretrained(tmp_path, tiny_config("llama"))
    sd = load_file(tmp_path / "model.safetensors")
    del sd["layers.0.mlp.up_proj.weight"]  # (fc.bias may be missing: heads without one load)
    save_file(sd, tmp_path / "model.safetensors")
    cfg["hidden_size"] = 32
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(EagleError, match="missing tensors"):
        EagleHead.from_pretrained(tmp_path, tiny_config("llama", hidden_size=32))


def test_a_small_whole_model_passed_as_a_head_is_named_as_one(tmp_path):
    """A whole HF model of 1-4 layers has a config an EAGLE-1 head could have: its weights tell it apart."""
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_config(tiny_config("llama")).save_pretrained(tmp_path)
    with pytest.raises(EagleError, match=r"holds a whole model \(model.layers.\*\), not an EAGLE-1 head"):
        EagleHead.from_pretrained(tmp_path, tiny_config("llama"))


def test_official_pytorch_model_bin_loads_without_unpickling_code(tmp_path):
    cfg = tiny_config("llama")
    torch.manual_seed(0)
    head = EagleHead(cfg)
    head.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    torch.save(head.eagle_state_dict(), tmp_path / "pytorch_model.bin")
    again = EagleHead.from_pretrained(tmp_path, cfg)
    torch.testing.assert_close(again.fc.weight, head.fc.weight)
    from eaglespec.draft.heads import inspect_head

    assert inspect_head(tmp_path).shapes["fc.weight"] == (64, 128)
    torch.save(head.eagle_state_dict(), tmp_path / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    assert inspect_head(tmp_path).shapes["fc.weight"] == (64, 128)  # torch's old format cannot be mapped: read
    torch.save({"fc.weight": object()}, tmp_path / "pytorch_model.bin")  # a pickled object: refused
    for load in (lambda: EagleHead.from_pretrained(tmp_path, cfg), lambda: inspect_head(tmp_path)):
        with pytest.raises(EagleError, match="not a readable weights file"):
            load()


@pytest.mark.parametrize("field, value, says", [
    ("intermediate_size", 100, "intermediate_size is 100 but the weights have 128"),
    ("num_attention_heads", 8, "num_attention_heads x head_dim is 128 but the weights have 64"),
    ("num_key_value_heads", 4, "num_key_value_heads x head_dim is 64 but the weights have 32"),
    ("head_dim", 8, "num_attention_heads x head_dim is 32 but the weights have 64"),
])
def test_a_config_that_disagrees_with_its_weights_is_refused(tmp_path, field, value, says):
    """The target is the head's own (so its shapes fit): only config.json is wrong, which used to
    load without a word. Refused before a target is needed (inspect_head) and when loading."""
    from eaglespec.draft.heads import inspect_head, load_head

    cfg = tiny_config("llama")
    EagleHead(cfg).save_pretrained(tmp_path)
    assert inspect_head(tmp_path).kind == "eagle1"
    saved = json.loads((tmp_path / "config.json").read_text())
    saved[field] = value
    (tmp_path / "config.json").write_text(json.dumps(saved))
    for load in (lambda: inspect_head(tmp_path), lambda: load_head(tmp_path, cfg),
                 lambda: EagleHead.from_pretrained(tmp_path, cfg)):
        with pytest.raises(EagleError, match=says) as info:
            load()
        assert "\n" not in str(info.value) and str(tmp_path / "config.json") in str(info.value)


def test_inspect_head_reads_headers_only_and_names_damaged_files(tmp_path):
    from eaglespec.draft.heads import inspect_head

    cfg = tiny_config("llama")
    EagleHead(cfg).save_pretrained(tmp_path)
    files = inspect_head(tmp_path)
    assert files.shapes["fc.weight"] == (64, 128) and files.weights.name == "model.safetensors"
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[:20])  # a cut download: the header is incomplete
    with pytest.raises(EagleError, match="model.safetensors is not a readable weights file"):
        inspect_head(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertModel"], "num_hidden_layers": 12}))
    with pytest.raises(EagleError, match="neither an EAGLE-1 head"):
        inspect_head(tmp_path)


def test_a_head_of_two_layers_saves_loads_and_refuses_a_config_that_disagrees(tmp_path):
    """--head-layers 2: layers.0 without its input norm (the paper's layer), layers.1 with it (as
    vLLM's and SGLang's EAGLE-1 models build further layers); config.json states the count, a
    reload rebuilds it and gives the same outputs, and a count the weights do not hold is refused."""
    from eaglespec.draft.heads import load_head

    cfg = tiny_config("llama")
    torch.manual_seed(0)
    head = EagleHead(cfg, layers=2)
    head.save_pretrained(tmp_path)
    sd = load_file(tmp_path / "model.safetensors")
    assert set(sd) == EAGLE1_KEYS | {k.replace("layers.0.", "layers.1.") for k in EAGLE1_KEYS if k.startswith("layers.")} \
        | {"layers.1.input_layernorm.weight"}
    assert json.loads((tmp_path / "config.json").read_text())["num_hidden_layers"] == 2
    loaded = load_head(tmp_path, cfg)
    assert loaded.layers == 2
    embeds, features = torch.randn(1, 5, 64), torch.randn(1, 5, 64)
    torch.testing.assert_close(loaded(embeds, features), head(embeds, features), rtol=0, atol=0)
    saved = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**saved, "num_hidden_layers": 1}))
    with pytest.raises(EagleError, match="num_hidden_layers is 1 but the weights hold 2 decoder layers"):
        load_head(tmp_path, cfg)
    for layers in (0, 5, True):
        with pytest.raises(EagleError, match="an EAGLE-1 head has 1 to 4 decoder layers"):
            EagleHead(cfg, layers=layers)
