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
    assert saved["architectures"] == ["LlamaForCausalLM"] and saved["bias"] is True


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
    del sd["fc.bias"]
    save_file(sd, tmp_path / "model.safetensors")
    cfg["hidden_size"] = 32
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(EagleError, match="missing tensors"):
        EagleHead.from_pretrained(tmp_path, tiny_config("llama", hidden_size=32))


def test_official_pytorch_model_bin_loads_without_unpickling_code(tmp_path):
    cfg = tiny_config("llama")
    torch.manual_seed(0)
    head = EagleHead(cfg)
    head.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    torch.save(head.eagle_state_dict(), tmp_path / "pytorch_model.bin")
    again = EagleHead.from_pretrained(tmp_path, cfg)
    torch.testing.assert_close(again.fc.weight, head.fc.weight)
    torch.save({"fc.weight": object()}, tmp_path / "pytorch_model.bin")  # a pickled object: refused
    with pytest.raises(EagleError, match="not a readable weights file"):
        EagleHead.from_pretrained(tmp_path, cfg)
