"""Heads that move between engines (interop/formats.py, docs/interop.md): export, import and
direct loading round trips for every format; the official EAGLE code (eagle-llm 1.2.1) and
vLLM's speculators (0.9.0) reading our exports where they run on CPU; the config keys and tensor
names each GPU engine's loader reads, pinned from its source; bad input refused, nothing written."""

import importlib.util
import json
import sys
import types

import pytest
import torch
from conftest import tiny_target
from safetensors.torch import load_file, save_file
from test_decoding import PROMPT
from test_eagle3 import eagle3_head

from eaglespec.cli.commands import main
from eaglespec.draft.head import EagleHead
from eaglespec.draft.heads import load_head
from eaglespec.draft.vocab import save_draft_vocab
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.errors import EagleError
from eaglespec.interop.formats import LLAMA_LAYER, detect_format, export_head, import_head

HEAD_FORMATS = ["official", "vllm", "sglang"]  # llamacpp: tests/interop/test_llamacpp.py (it builds llama.cpp)


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama")


def saved_head(target, kind, directory, fc_bias=True, seed=1):
    """A head written as `eaglespec train` writes it, with a draft vocabulary and acceptance.json."""
    if kind == "eagle1":
        torch.manual_seed(seed)
        head = EagleHead(target.config, fc_bias=fc_bias).to(target.dtype)
    else:
        head = eagle3_head(target, seed=seed)
    head.save_pretrained(directory, extra={"trained_by": "test", "target": {"name": "tiny-llama"}})
    if kind == "eagle1":
        save_draft_vocab(directory, torch.arange(target.vocab_size).flip(0))
    (directory / "acceptance.json").write_text(json.dumps({"steps": 0}))
    return head


def same_generation(target, a, b, tree="dynamic:3,3,8"):
    """Greedy generation with head a and head b: the same tokens and the same accepted lengths."""
    ra = EagleGenerator(target, a.to(target.dtype), tree).generate(input_ids=PROMPT, max_new_tokens=24,
                                                                   stop_token_ids=set())
    rb = EagleGenerator(target, b.to(target.dtype), tree).generate(input_ids=PROMPT, max_new_tokens=24,
                                                                   stop_token_ids=set())
    assert ra.token_ids == rb.token_ids and len(ra.token_ids) == 24
    assert [s.accepted for s in ra.steps] == [s.accepted for s in rb.steps]


def same_head(a, b):
    sa, sb = a.eagle_state_dict(), b.eagle_state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k].to(sb[k].dtype), sb[k]), k


# ---- round trips: export, then load with --head, then import, then load --------------------------
@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
@pytest.mark.parametrize("fmt", HEAD_FORMATS)
def test_export_load_import_round_trip(target, tmp_path, kind, fmt):
    # vLLM's EAGLE-1 fc has no bias: the head that matches it exactly is trained with --no-fc-bias
    saved_head(target, kind, tmp_path / "head", fc_bias=not (kind == "eagle1" and fmt == "vllm"))
    original = load_head(tmp_path / "head", target.config)
    files = export_head(tmp_path / "head", tmp_path / "out", fmt, target=target)
    assert all(f.is_file() and tmp_path / "out" in f.parents for f in files)
    assert detect_format(tmp_path / "out") == fmt
    direct = load_head(tmp_path / "out", target.config)  # what --head DIR does
    same_head(original, direct)
    same_generation(target, original, direct)
    result = import_head(tmp_path / "out", tmp_path / "back", target=target)
    assert result.format == fmt and result.kind == kind
    back = load_head(tmp_path / "back", target.config)
    same_head(original, back)
    assert detect_format(tmp_path / "back") == "eaglespec"
    # our extras come back beside the weights; the head dir is as training writes it
    assert (tmp_path / "back" / "acceptance.json").is_file()
    assert (tmp_path / "back" / "draft_vocab.safetensors").is_file() == (kind == "eagle1")
    cfg = json.loads((tmp_path / "back" / "config.json").read_text())
    assert cfg["eaglespec"]["trained_by"] == "test" and cfg["eaglespec"]["imported_from"] == fmt


@pytest.mark.parametrize("fmt", HEAD_FORMATS)
def test_exports_carry_the_draft_vocabulary_out_of_the_engines_way(target, tmp_path, fmt):
    """vLLM and SGLang load every *.safetensors beside the weights (vLLM weight_utils, SGLang
    model_loader/loader.py allow_patterns): our draft vocabulary goes into eaglespec/, where
    --head still finds it."""
    from eaglespec.draft.vocab import load_draft_vocab

    saved_head(target, "eagle1", tmp_path / "head")
    export_head(tmp_path / "head", tmp_path / "out", fmt, target=target)
    top = sorted(p.name for p in (tmp_path / "out").iterdir() if p.is_file())
    assert [n for n in top if n.endswith(".safetensors")] in ([], ["model.safetensors"])
    assert (tmp_path / "out" / "eaglespec" / "draft_vocab.safetensors").is_file()
    torch.testing.assert_close(load_draft_vocab(tmp_path / "out", 5, target.vocab_size),
                               load_draft_vocab(tmp_path / "head", 5, target.vocab_size))


def test_the_cli_exports_imports_and_names_the_format(target, tmp_path, capsys):
    from tiny_tokenizer import tiny_tokenizer

    saved_head(target, "eagle3", tmp_path / "head")
    assert main(["export", str(tmp_path / "head"), str(tmp_path / "out"), "--format", "vllm"]) == 0
    assert "exported" in capsys.readouterr().err
    assert main(["import", str(tmp_path / "out"), str(tmp_path / "back")]) == 0
    assert "(format: vllm)" in capsys.readouterr().err
    target.model.save_pretrained(tmp_path / "target")
    tiny_tokenizer().save_pretrained(tmp_path / "target")
    assert main(["generate", "--target", str(tmp_path / "target"), "--head", str(tmp_path / "out"), "--tree",
                 "eagle2:6,2,2", "--max-new-tokens", "4", "--prompt", "hi"]) == 0
    err = capsys.readouterr().err
    assert f"head: EAGLE-3 from {tmp_path / 'out'} (format: vllm)" in err
    assert "official EAGLE-2 total_token=6, depth=2, top_k=2 is our dynamic:2,3,5" in err


# ---- the official EAGLE code reads our export ------------------------------------------------------
def official_model(directory):
    """eagle-llm 1.2.1's own loading, as EaModel.__init__ and EaModel.from_pretrained
    (eagle/model/ea_model.py) do it: EConfig from config.json, `bias` read from the raw JSON
    (true when absent), Model(config, bias), torch.load(pytorch_model.bin) (here with weights_only=True), strict load.

    eagle-llm 1.2.1 predates transformers 5, whose PretrainedConfig turned `rope_scaling` into an
    alias of `rope_parameters` (never None): cnets.py then fails with KeyError 'type' on any config.
    The subclass gives back transformers 4's plain attribute, the raw config.json value; everything
    else is eagle-llm's code."""
    cnets = pytest.importorskip("eagle.model.cnets")
    from eagle.model.configs import EConfig

    class EConfigTransformers4(EConfig):
        rope_scaling = None

    raw = json.loads((directory / "config.json").read_text())
    config = EConfigTransformers4.from_pretrained(str(directory))
    config.__dict__["rope_scaling"] = raw.get("rope_scaling")
    try:
        bias = raw["bias"]
    except KeyError:
        bias = True
    model = cnets.Model(config, bias=bias)
    model.load_state_dict(torch.load(directory / "pytorch_model.bin", map_location="cpu", weights_only=True), strict=True)
    return model.double().eval()


@pytest.mark.parametrize("fc_bias", [True, False])
def test_the_official_code_loads_our_export_and_drafts_the_same(target, tmp_path, fc_bias):
    """Same head, same inputs: the official Model's draft features and logits equal ours (the
    tiny Llama has RoPE base 10000, the one eagle-llm 1.2.1 hard-codes; its rotary tables are
    float32, hence the tolerance)."""
    saved_head(target, "eagle1", tmp_path / "head", fc_bias=fc_bias)
    export_head(tmp_path / "head", tmp_path / "out", "official", target=target)
    theirs = official_model(tmp_path / "out")
    assert (theirs.fc.bias is not None) == fc_bias
    ours = load_head(tmp_path / "out", target.config).to(torch.float64).eval()
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        features = target.features(ids)  # f[t], the target's own
        next_ids = torch.cat([ids[:, 1:], torch.tensor([[42]])], 1)  # x[t+1]
        a = theirs(features, next_ids)  # Model.forward(hidden_states, input_ids): embeds x[t+1] itself
        b = ours(target.embed_tokens(next_ids), features)
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(target.lm_head(a), target.lm_head(b), rtol=1e-6, atol=1e-6)


# ---- vLLM's speculators reads our vLLM export ---------------------------------------------------
def test_speculators_converts_and_validates_the_vllm_eagle3_export(target, tmp_path, monkeypatch):
    """speculators 0.9.0 (vLLM's library for speculator formats) converts the published EAGLE-3
    layout into its own and validates it by loading it (Eagle3Converter(validate=True)). It
    handles EAGLE-3 only. Its package imports `datasets` at module level for training alone; a
    stand-in keeps that out of this project's dependencies."""
    if importlib.util.find_spec("datasets") is None:
        monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_from_disk=None))
    converter = pytest.importorskip("speculators.convert.eagle.eagle3_converter")
    head = saved_head(target, "eagle3", tmp_path / "head")
    export_head(tmp_path / "head", tmp_path / "out", "vllm")
    target.model.save_pretrained(tmp_path / "target")
    ids = list(head.config.layer_ids)
    converter.Eagle3Converter().convert(tmp_path / "out", tmp_path / "spec", str(tmp_path / "target"), validate=True,
                                        eagle_aux_hidden_state_layer_ids=ids)
    cfg = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3" and cfg["draft_vocab_size"] == head.config.draft_vocab_size
    assert cfg["norm_before_residual"] is False and cfg["target_hidden_size"] == target.hidden_size
    assert cfg["eagle_aux_hidden_state_layer_ids"] == ids
    assert cfg["transformer_layer_config"]["rope_parameters"]["rope_theta"] == head.config.rope_theta
    theirs, ours = load_file(tmp_path / "spec" / "model.safetensors"), head.eagle_state_dict()
    renamed = {k.replace("layers.0.", "midlayer."): v for k, v in theirs.items()}
    assert set(renamed) == set(ours)
    for k, v in ours.items():
        assert torch.equal(renamed[k].to(v.dtype), v), k


# ---- what each GPU engine's loader reads, pinned from its source ------------------------------------
def exported(target, tmp_path, kind, fmt, **kw):
    saved_head(target, kind, tmp_path / "head", **kw)
    export_head(tmp_path / "head", tmp_path / fmt, fmt, target=target)
    out = tmp_path / fmt
    return json.loads((out / "config.json").read_text()), load_file(out / "model.safetensors"), out


EAGLE1_LAYER = {f"layers.0.{n}" for n in LLAMA_LAYER}
EAGLE3_TENSORS = {"fc.weight", "norm.weight", "lm_head.weight", "midlayer.hidden_norm.weight",
                  "midlayer.input_layernorm.weight", "midlayer.post_attention_layernorm.weight",
                  *(f"midlayer.{n}" for n in LLAMA_LAYER if n != "post_attention_layernorm.weight")}


def assert_plain_llama_config(cfg, target):
    """What every HF-config reader of these engines takes from config.json."""
    assert cfg["num_hidden_layers"] == 1 and cfg["model_type"] == "llama"
    assert cfg["hidden_size"] == target.hidden_size and cfg["vocab_size"] == target.vocab_size
    assert "quantization_config" not in cfg and cfg["tie_word_embeddings"] is False
    assert cfg["attention_bias"] is False and cfg.get("bias", False) is False
    assert cfg["rope_theta"] == cfg["rope_parameters"]["rope_theta"] == 10000.0


def test_vllm_eagle1_layout(target, tmp_path, capsys):
    """vllm 0.33.0, vllm/model_executor/models/llama_eagle.py: EagleLlamaForCausalLM, chosen by
    transformers_utils/configs/eagle.py from architectures LlamaForCausalLM (method "eagle");
    load_weights prefixes "model." to every name and AutoWeightsLoader (models/utils.py) refuses
    names without a parameter, but skips unexpected `.bias` ones silently: fc is
    ReplicatedLinear(2H, H, bias=False), so the export drops fc.bias itself and says so; layer 0's
    input_layernorm is an Identity, so no input norm either. models/llama.py LlamaDecoderLayer: attention
    (and o_proj) biases when `attention_bias` OR `bias` is true; RoPE from `rope_parameters`."""
    cfg, sd, _ = exported(target, tmp_path, "eagle1", "vllm")
    assert "fc.bias" in capsys.readouterr().err  # said, and measured in docs/interop.md
    assert set(sd) == {"fc.weight"} | EAGLE1_LAYER
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert_plain_llama_config(cfg, target)


def test_vllm_eagle3_layout(target, tmp_path):
    """vllm 0.33.0, vllm/model_executor/models/llama_eagle3.py: LlamaForCausalLMEagle3 maps to
    Eagle3LlamaForCausalLM (models/registry.py); midlayer.* -> layers.0.*; t2d skipped; d2t ->
    draft_id_to_target_id, a parameter only when draft_vocab_size != the target's vocabulary,
    and target id = draft id + d2t (compute_logits). Its layer's qkv bias is `attention_bias`;
    layer ids: top-level eagle_aux_hidden_state_layer_ids, else eagle_config's
    (v1/worker/gpu_model_runner.py), the residual stream entering each layer (interfaces.py)."""
    head = eagle3_head(target)
    cfg, sd, _ = exported(target, tmp_path, "eagle3", "vllm")
    assert set(sd) == EAGLE3_TENSORS | {"d2t", "t2d"}
    assert torch.equal(torch.arange(sd["d2t"].numel()) + sd["d2t"], head.target_ids())
    assert sd["d2t"].dtype == torch.int64
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["draft_vocab_size"] == head.config.draft_vocab_size and cfg["target_hidden_size"] == target.hidden_size
    assert cfg["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": list(head.config.layer_ids),
                                   "use_aux_hidden_state": True}
    assert cfg["eagle_aux_hidden_state_layer_ids"] == list(head.config.layer_ids)
    assert not cfg.get("norm_before_residual") and not cfg.get("norm_before_fc") and not cfg.get("fc_norm")
    assert_plain_llama_config(cfg, target)


def test_the_trained_eagle3_head_is_vllms_layout_as_is(target, tmp_path):
    """What `eaglespec train --head eagle3` writes is what the vllm export writes (README's claim):
    vLLM 0.33.0 loads it as is."""
    saved_head(target, "eagle3", tmp_path / "head")
    export_head(tmp_path / "head", tmp_path / "out", "vllm")
    ours, theirs = (json.loads((tmp_path / d / "config.json").read_text()) for d in ("head", "out"))
    assert {k: v for k, v in ours.items() if k != "eaglespec"} == {k: v for k, v in theirs.items() if k != "eaglespec"}
    a, b = load_file(tmp_path / "head" / "model.safetensors"), load_file(tmp_path / "out" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert sorted(p.name for p in (tmp_path / "head").glob("*.safetensors")) == ["model.safetensors"]


def test_vllm_eagle3_full_vocabulary_has_no_d2t(target, tmp_path):
    """With draft_vocab_size == the target's, vLLM has no draft_id_to_target_id to load d2t into."""
    torch.manual_seed(0)
    from eaglespec.draft.eagle3 import Eagle3Config, Eagle3Head

    head = Eagle3Head(Eagle3Config.for_target(target.config, target.vocab_size))
    head.set_draft_vocab(torch.arange(target.vocab_size))
    head.save_pretrained(tmp_path / "head")
    export_head(tmp_path / "head", tmp_path / "out", "vllm")
    assert set(load_file(tmp_path / "out" / "model.safetensors")) == EAGLE3_TENSORS
    same_head(head, load_head(tmp_path / "out", target.config))


def test_sglang_eagle1_layout(target, tmp_path):
    """sglang 0.5.23, sglang/srt/models/llama_eagle.py: EntryClass LlamaForCausalLMEagle, picked
    from architectures (model_loader/utils.py); its fc is torch.nn.Linear(2H, H) with a bias, so a
    head without one gets zeros (the same function); layer 0 deletes input_layernorm;
    tie_word_embeddings true would make lm_head the embedding. models/llama.py: `attention_bias`
    OR `bias` is attention bias."""
    cfg, sd, _ = exported(target, tmp_path, "eagle1", "sglang", fc_bias=False)
    assert set(sd) == {"fc.weight", "fc.bias"} | EAGLE1_LAYER and not sd["fc.bias"].any()
    assert cfg["architectures"] == ["LlamaForCausalLMEagle"] and "bias" not in cfg
    assert_plain_llama_config(cfg, target)


def test_sglang_eagle1_qwen2_layout(tmp_path):
    """sglang 0.5.23, sglang/srt/models/qwen2_eagle.py: Qwen2ForCausalLMEagle (q/k/v biases)."""
    qwen = tiny_target("qwen2")
    cfg, sd, _ = exported(qwen, tmp_path, "eagle1", "sglang")
    assert cfg["architectures"] == ["Qwen2ForCausalLMEagle"] and cfg["model_type"] == "qwen2"
    assert "layers.0.self_attn.q_proj.bias" in sd and "fc.bias" in sd


def test_sglang_eagle3_layout(target, tmp_path):
    """sglang 0.5.23, sglang/srt/models/llama_eagle3.py: LlamaForCausalLMEagle3; fc bias is
    `bias` (false); tie_word_embeddings false, else lm_head is the embedding; draft_vocab_size
    set, else the LM head comes from the target; d2t: hot_token_id = d2t + arange; t2d skipped.
    Layer ids: eagle_config's (model_runner_components/spec_aux_hidden_state.py), each read as
    the residual stream entering layer id + 1 (models/llama.py set_eagle3_layers_to_capture),
    one further than vLLM and us: the export writes ours minus one."""
    head = eagle3_head(target)
    cfg, sd, out = exported(target, tmp_path, "eagle3", "sglang")
    assert set(sd) == EAGLE3_TENSORS | {"d2t", "t2d"}
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["bias"] is False
    assert cfg["draft_vocab_size"] == head.config.draft_vocab_size
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [i - 1 for i in head.config.layer_ids]
    assert "eagle_aux_hidden_state_layer_ids" not in cfg
    assert load_head(out, target.config).hidden_layers == head.hidden_layers  # --head reads ours back
    assert_plain_llama_config(cfg, target)


def test_official_layout(target, tmp_path):
    """eagle-llm 1.2.1: ea_model.py reads pytorch_model.bin only, `bias` from the raw JSON (true
    when absent) and loads strictly into cnets.Model, which owns embed_tokens; configs.py EConfig
    takes rope_scaling as {"type", "factor"} (linear or dynamic) and no rope_theta."""
    saved_head(target, "eagle1", tmp_path / "head", fc_bias=False)
    export_head(tmp_path / "head", tmp_path / "out", "official", target=target)
    sd = torch.load(tmp_path / "out" / "pytorch_model.bin", weights_only=True)
    assert set(sd) == {"embed_tokens.weight", "fc.weight"} | EAGLE1_LAYER
    torch.testing.assert_close(sd["embed_tokens.weight"], target.embed_tokens.weight.detach())
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["bias"] is False and cfg["rope_scaling"] is None and cfg["rope_theta"] == 10000.0
    assert not list((tmp_path / "out").glob("*.safetensors"))


# ---- what --no-fc-bias is for: vLLM drops the bias ------------------------------------------------
def test_dropping_the_fc_bias_changes_the_drafts_not_the_output(target, tmp_path, capsys):
    """The vllm export of a head trained with an fc bias: the drafts differ (measured here and, on
    the shipped SmolLM2 head, in docs/interop.md), the greedy output does not."""
    saved_head(target, "eagle1", tmp_path / "head")
    export_head(tmp_path / "head", tmp_path / "out", "vllm")
    assert "dropped" in capsys.readouterr().err
    with_bias = load_head(tmp_path / "head", target.config).to(target.dtype)
    without = load_head(tmp_path / "out", target.config).to(target.dtype)
    assert without.fc.bias is None
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        features, embeds = target.features(ids), target.embed_tokens(ids[:, 1:])
        a = target.lm_head(with_bias(embeds, features[:, :-1]))
        b = target.lm_head(without(embeds, features[:, :-1]))
    change = float((a - b).abs().max())
    agreement = float((a.argmax(-1) == b.argmax(-1)).float().mean())
    print(f"tiny Llama: max |draft logit change| {change:.3f}, top-1 draft agreement {agreement:.2f}")
    assert change > 1e-3
    vanilla = EagleGenerator(target, None).generate(input_ids=PROMPT, max_new_tokens=24, stop_token_ids=set())
    for h in (with_bias, without):
        out = EagleGenerator(target, h, "chain:3").generate(input_ids=PROMPT, max_new_tokens=24,
                                                                             stop_token_ids=set())
        assert out.token_ids == vanilla.token_ids


def test_training_without_fc_bias_gives_vllms_head_exactly(tmp_path):
    """`eaglespec train --no-fc-bias`: the trained head has no fc.bias, says `bias: false`, and its
    vllm export carries its own tensors, nothing dropped."""
    from test_train_capture import synthetic_examples

    from eaglespec.train.capture import OnlineDataset
    from eaglespec.train.config import TrainConfig
    from eaglespec.train.trainer import Trainer

    small = tiny_target(dtype=torch.float32, check=False)
    config = TrainConfig(fc_bias=False, max_steps=2, grad_accum=1, warmup=1, eval_fraction=0.25, eval_depths=1)
    Trainer(small, OnlineDataset(small, synthetic_examples(4)), config, tmp_path / "head", progress=False).run()
    sd = load_file(tmp_path / "head" / "model.safetensors")
    assert "fc.bias" not in sd and json.loads((tmp_path / "head" / "config.json").read_text())["bias"] is False
    export_head(tmp_path / "head", tmp_path / "vllm", "vllm")
    exported_sd = load_file(tmp_path / "vllm" / "model.safetensors")
    assert exported_sd.keys() == sd.keys() and all(torch.equal(exported_sd[k], sd[k]) for k in sd)


# ---- official releases and older heads load too ------------------------------------------------------
@pytest.mark.parametrize("weights", ["bin", "safetensors"])
@pytest.mark.parametrize("rope", ["rope_theta", "rope_parameters"])
def test_official_releases_load_and_import(target, tmp_path, weights, rope):
    """As the releases come: pytorch_model.bin or safetensors, with embed_tokens, without fc.bias
    (the LLaMA-3 ones, `bias: false`), a transformers 4 config (rope_theta) or a 5 one."""
    torch.manual_seed(3)
    head = EagleHead(target.config, fc_bias=False)
    sd = {"embed_tokens.weight": target.embed_tokens.weight.detach().float(), **head.eagle_state_dict()}
    cfg = {k: v for k, v in target.config.to_dict().items() if k not in ("rope_parameters", "layer_types")}
    cfg.update(num_hidden_layers=1, bias=False, architectures=["LlamaForCausalLM"])
    cfg.update({"rope_theta": 10000.0, "rope_scaling": None} if rope == "rope_theta" else
               {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}})
    (tmp_path / "rel").mkdir()
    (tmp_path / "rel" / "config.json").write_text(json.dumps(cfg))
    if weights == "bin":
        torch.save(sd, tmp_path / "rel" / "pytorch_model.bin")
    else:
        save_file(sd, tmp_path / "rel" / "model.safetensors")
    assert detect_format(tmp_path / "rel") == ("official" if weights == "bin" else "vllm")
    same_head(head, load_head(tmp_path / "rel", target.config))
    import_head(tmp_path / "rel", tmp_path / "back")
    same_head(head, load_head(tmp_path / "back", target.config))
    saved = json.loads((tmp_path / "back" / "config.json").read_text())
    assert saved["rope_theta"] == 10000.0 and saved["bias"] is False


# ---- bad input --------------------------------------------------------------------------------------
def nothing_written(tmp_path, out):
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]  # no staging left


def test_a_format_that_cannot_hold_the_head_names_those_that_can(target, tmp_path):
    saved_head(target, "eagle1", tmp_path / "head")
    with pytest.raises(EagleError, match="llamacpp cannot hold this EAGLE-1 head.*formats that can: official, vllm, "
                                         "sglang") as info:
        export_head(tmp_path / "head", tmp_path / "out", "llamacpp")
    assert "\n" not in str(info.value)
    nothing_written(tmp_path, tmp_path / "out")
    EagleHead(tiny_target("qwen2").config).save_pretrained(tmp_path / "qwen2")
    with pytest.raises(EagleError, match=r"vllm cannot hold .* qwen2's; vLLM 0.33.0 runs EAGLE-1 heads of Llama "
                                         r"layers only \(EagleLlamaForCausalLM\); formats that can: sglang$"):
        export_head(tmp_path / "qwen2", tmp_path / "out", "vllm")
    EagleHead(tiny_target("qwen3").config).save_pretrained(tmp_path / "qwen3")
    with pytest.raises(EagleError, match="formats that can: none$"):
        export_head(tmp_path / "qwen3", tmp_path / "out", "sglang")
    nothing_written(tmp_path, tmp_path / "out")
    EagleHead(target.config, layers=2).save_pretrained(tmp_path / "two")  # read, but no format is tested with it
    for fmt in ("official", "vllm", "sglang"):
        with pytest.raises(EagleError, match=f"{fmt} cannot hold .*: it has 2 decoder layers, and the exports are tested "
                                             "with one-layer EAGLE-1 heads only .*; formats that can: none$"):
            export_head(tmp_path / "two", tmp_path / "out", fmt)
    nothing_written(tmp_path, tmp_path / "out")
    import_head(tmp_path / "two", tmp_path / "back")  # eaglespec's own layout keeps its layers
    assert load_head(tmp_path / "back", target.config).layers == 2


def test_official_eagle1_needs_the_targets_embedding(target, tmp_path):
    saved_head(target, "eagle1", tmp_path / "head")
    with pytest.raises(EagleError, match="strict=True.*pass --target.*e.g. --target tiny-llama"):
        export_head(tmp_path / "head", tmp_path / "out", "official")
    nothing_written(tmp_path, tmp_path / "out")


def test_a_missing_llamacpp_module_fails_only_that_format(target, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "eaglespec.interop.llamacpp", None)  # as if the file were absent
    saved_head(target, "eagle3", tmp_path / "head")
    with pytest.raises(EagleError, match="llamacpp is not available.*official, vllm and sglang are"):
        export_head(tmp_path / "head", tmp_path / "out", "llamacpp")
    nothing_written(tmp_path, tmp_path / "out")
    export_head(tmp_path / "head", tmp_path / "out", "sglang")


def test_llamacpp_lives_in_the_cache_folder_from_any_directory(tmp_path, monkeypatch):
    from eaglespec.interop import build_llamacpp

    monkeypatch.delenv(build_llamacpp.ROOT_ENV)
    monkeypatch.setenv("EAGLESPEC_CACHE", str(tmp_path / "cache"))
    for where in (tmp_path / "a", tmp_path / "b"):
        where.mkdir()
        monkeypatch.chdir(where)
        assert build_llamacpp.default_root() == (tmp_path / "cache" / "llamacpp").resolve()
        with pytest.raises(EagleError, match=f"{tmp_path / 'cache' / 'llamacpp'}.*build_llamacpp --source-only"):
            build_llamacpp.converter()
    monkeypatch.setenv(build_llamacpp.ROOT_ENV, str(tmp_path / "mine"))
    assert build_llamacpp.default_root() == (tmp_path / "mine").resolve()


def test_the_llamacpp_export_names_its_extra(target, tmp_path, monkeypatch):
    from eaglespec.interop import build_llamacpp, llamacpp

    monkeypatch.setenv(build_llamacpp.ROOT_ENV, str(tmp_path / "root"))
    script = build_llamacpp.source_dir() / "convert_hf_to_gguf.py"
    script.parent.mkdir(parents=True)
    script.write_text("raise SystemExit(1)\n")
    real = llamacpp.importlib.util.find_spec
    monkeypatch.setattr(llamacpp.importlib.util, "find_spec", lambda name, *a: None if name == "sentencepiece" else real(name, *a))
    saved_head(target, "eagle3", tmp_path / "head")
    with pytest.raises(EagleError, match=r"needs the sentencepiece package: pip install 'eaglespec\[llamacpp\]'"):
        export_head(tmp_path / "head", tmp_path / "out", "llamacpp")
    nothing_written(tmp_path, tmp_path / "out")


def test_every_extra_a_message_names_is_declared():
    """`pip install 'eaglespec[X]'` in a message is an extra of pyproject.toml, with what it is for."""
    import re
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    named = {m for p in (root / "src").rglob("*.py") for m in re.findall(r"eaglespec\[(\w+)\]", p.read_text())}
    assert named >= {"llamacpp", "serve"} and named <= set(extras)
    assert "sentencepiece==0.1.99" in extras["llamacpp"]
    assert {"fastapi", "uvicorn"} <= {re.split("[<>=]", r)[0] for r in extras["serve"]}


@pytest.mark.parametrize("case, says", [
    ("not_a_head", "neither an EAGLE-1 head"),
    ("no_config", "no config.json"),
    ("corrupt", "model.safetensors is not a readable weights file"),
    ("stray_tensor", "not part of an EAGLE-1 head"),
    ("other_vocabulary", "pytorch_model.bin: embed_tokens.weight has shape \\(64, 64\\).*another vocabulary"),
    ("other_hidden_size", "hidden_size=32 but the target has hidden_size=64"),
    ("other_target_vocab", "vocab_size=128 but the target has vocab_size=96"),
])
def test_bad_imports_are_refused_in_one_line_and_write_nothing(target, tmp_path, case, says):
    src, out = tmp_path / "src", tmp_path / "out"
    check = None
    if case == "not_a_head":
        src.mkdir()
        (src / "config.json").write_text(json.dumps({"architectures": ["BertModel"], "num_hidden_layers": 12}))
        save_file({"w": torch.zeros(2)}, src / "model.safetensors")
    elif case == "no_config":
        src.mkdir()
        save_file({"w": torch.zeros(2)}, src / "model.safetensors")
    elif case == "corrupt":
        saved_head(target, "eagle1", src)
        data = (src / "model.safetensors").read_bytes()
        (src / "model.safetensors").write_bytes(data[: len(data) // 2])
    elif case == "stray_tensor":
        saved_head(target, "eagle1", src)
        sd = load_file(src / "model.safetensors")
        save_file({**sd, "lm_head.weight": torch.zeros(4, 4)}, src / "model.safetensors")
    elif case == "other_vocabulary":  # an official release whose embedding is another model's
        saved_head(target, "eagle1", src)
        sd = load_file(src / "model.safetensors")
        (src / "model.safetensors").unlink()
        torch.save({**sd, "embed_tokens.weight": torch.zeros(64, 64)}, src / "pytorch_model.bin")
    elif case == "other_hidden_size":
        EagleHead(tiny_target("llama", hidden_size=32, check=False).config).save_pretrained(src)
        check = target
    else:
        saved_head(target, "eagle1", src)
        check = tiny_target("llama", vocab_size=96, check=False)
    with pytest.raises(EagleError, match=says) as info:
        import_head(src, out, target=check)
    assert "\n" not in str(info.value)
    nothing_written(tmp_path, out)
    if check is None:  # the command line: exit code 2, the same line
        assert main(["import", str(src), str(out)]) == 2
        nothing_written(tmp_path, out)


def test_an_existing_folder_is_kept_unless_overwrite(target, tmp_path):
    saved_head(target, "eagle3", tmp_path / "head")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(EagleError, match="not empty: pass a new folder, or --overwrite"):
        export_head(tmp_path / "head", tmp_path / "out", "vllm")
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"
    export_head(tmp_path / "head", tmp_path / "out", "vllm", overwrite=True)
    assert not (tmp_path / "out" / "keep.txt").exists() and detect_format(tmp_path / "out") == "vllm"
    with pytest.raises(EagleError, match="the head's own folder"):
        export_head(tmp_path / "head", tmp_path / "head", "vllm", overwrite=True)
