"""`eaglespec export` and `eaglespec import`: heads in the layouts that other engines load.

The heads keep one internal naming (draft/head.py, draft/eagle3.py: the published EAGLE names);
this module renames, drops and adds what each engine's loader reads, and nothing else. Every
fact is taken from the loader code of the version named (docs/interop.md lists them):

    official  EAGLE's own code, eagle-llm 1.2.1: eagle/model/ea_model.py, cnets.py, configs.py
    vllm      vLLM 0.33.0: vllm/model_executor/models/llama_eagle.py, llama_eagle3.py, llama.py
    sglang    SGLang 0.5.23: sglang/srt/models/llama_eagle.py, qwen2_eagle.py, llama_eagle3.py
    llamacpp  llama.cpp's GGUF (interop/llamacpp.py)

Both commands write into a temporary folder beside OUT_DIR and rename it at the end: a refused
or failed run leaves nothing behind. Our own extras travel in an `eaglespec/` subfolder
(draft_vocab.safetensors: vLLM and SGLang load every `*.safetensors` beside the weights) and
acceptance.json (a JSON file no engine reads); `import` puts them back beside the weights.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..draft.contract import CONFIG, LEGACY_WEIGHTS, check_config_against_weights, head_kind, read_head_files, rope_fields, write_head
from ..draft.head import eagle1_config
from ..draft.heads import head_from_files, inspect_head, load_head
from ..draft.vocab import EXPORTED_DIR
from ..draft.vocab import FILE as VOCAB_FILE
from ..draft.vocab import vocab_path
from ..errors import EagleError, one_line
from ..files import _umask

FORMATS = ("official", "vllm", "sglang", "llamacpp")
ACCEPTANCE = "acceptance.json"  # tuning.STATS_FILE, read by --tree auto

# One decoder layer's tensors (under `layers.0.`) in the EAGLE-1 heads each engine builds.
LLAMA_LAYER = frozenset({
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight", "post_attention_layernorm.weight",
})
QWEN2_LAYER = LLAMA_LAYER | {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"}


@dataclass(frozen=True)
class SourceHead:
    """A head directory read once, its tensors under our names."""

    directory: Path
    kind: str                         # "eagle1" | "eagle3"
    config: dict                      # config.json without our `eaglespec` block
    extra: dict                       # our `eaglespec` block (training summary, target identity), or {}
    tensors: dict[str, torch.Tensor]  # EAGLE-1: fc.*, layers.N.*; EAGLE-3: fc, midlayer.*, norm, lm_head, d2t, t2d
    weights: Path                     # the file the tensors came from (named in errors)

    @property
    def dtype(self) -> torch.dtype:
        return self.tensors["fc.weight"].dtype

    @property
    def label(self) -> str:
        return self.kind.replace("eagle", "EAGLE-")


def detect_format(directory: str | os.PathLike) -> str:
    """Which layout a head directory is in: an export of ours says so in its `eaglespec` block;
    otherwise 'official' (pytorch_model.bin, or safetensors with an EAGLE-1 fc bias), 'sglang'
    (its *ForCausalLMEagle class), 'vllm' (an EAGLE-1 head without fc bias), 'vllm/sglang' (the
    published EAGLE-3 layout, which both read), 'eaglespec' (a head trained here), 'llamacpp'
    (a GGUF file)."""
    directory = Path(directory)
    if directory.suffix == ".gguf" or (directory.is_dir() and not (directory / CONFIG).exists()
                                       and any(directory.glob("*.gguf"))):
        return "llamacpp"
    files = inspect_head(directory)
    extra = files.config.get("eaglespec")
    if isinstance(extra, dict) and extra.get("format") in FORMATS:
        return extra["format"]
    if files.weights.name == LEGACY_WEIGHTS:
        return "official"
    if any(str(a).endswith("ForCausalLMEagle") for a in files.config.get("architectures") or []):
        return "sglang"
    if isinstance(extra, dict):
        return "eaglespec"
    if files.kind == "eagle3":
        return "vllm/sglang"
    return "official" if "fc.bias" in files.shapes else "vllm"


def read_source(directory: str | os.PathLike) -> SourceHead:
    """A head directory in any layout we write or the official releases use, its tensor names
    made ours: `model.` prefixes and the target's embedding (the official releases carry it)
    dropped, speculators' `layers.0.` for EAGLE-3's `midlayer.`. Anything else is refused."""
    directory = Path(directory)
    cfg, sd, weights = read_head_files(directory)
    kind = head_kind(cfg, str(directory))
    sd = {k.removeprefix("model."): v for k, v in sd.items()}
    if kind == "eagle3":
        sd = {("midlayer." + k.removeprefix("layers.0.") if k.startswith("layers.0.") else k): v for k, v in sd.items()}
    embed = sd.pop("embed_tokens.weight", None)
    ours = (("fc.", "layers.") if kind == "eagle1" else ("fc.", "midlayer.", "norm.", "lm_head.", "d2t", "t2d"))
    unknown = sorted(k for k in sd if not k.startswith(ours))
    if unknown:
        raise EagleError(f"{weights}: tensors {unknown[:4]}{'...' if len(unknown) > 4 else ''} are not part of an "
                         f"EAGLE-{kind[-1]} head; it is not a head eaglespec can read")
    if "fc.weight" not in sd:
        raise EagleError(f"{weights}: no fc.weight tensor; it is not an EAGLE head")
    check_config_against_weights(cfg, kind, {k: tuple(v.shape) for k, v in sd.items()}, directory)
    if embed is not None:
        wanted = (cfg.get("vocab_size"), cfg.get("hidden_size"))
        if tuple(embed.shape) != wanted:
            raise EagleError(f"{weights}: embed_tokens.weight has shape {tuple(embed.shape)} but config.json says "
                             f"vocab_size x hidden_size = {wanted}: the weights and config.json belong to different "
                             "targets (another vocabulary or hidden size)")
    extra = cfg.pop("eaglespec", None)
    extra = extra if isinstance(extra, dict) else {}
    if kind == "eagle3" and extra.get("layer_ids") is not None:  # an sglang export: our indexing is kept here
        ids = {"eagle_aux_hidden_state_layer_ids": extra["layer_ids"]}
        cfg["eagle_config"] = {**(cfg.get("eagle_config") or {}), **ids}
    return SourceHead(directory, kind, cfg, extra, sd, weights)


def build_head(src: SourceHead, target_config=None):
    """Our head module from `src`: every shape and table checked, against the target when one is
    given, else against the head's own config.json."""
    return head_from_files(src.config, src.tensors, target_config, str(src.directory))


# -- what each format can hold -------------------------------------------------------------------
def _eagle1_family(src: SourceHead) -> str | None:
    """'llama' or 'qwen2' when the head's decoder layer is that family's, exactly; else None."""
    layer = frozenset(k.removeprefix("layers.0.") for k in src.tensors if k.startswith("layers.0."))
    cfg = src.config
    sliding = cfg.get("sliding_window") and cfg.get("use_sliding_window", True)
    if sliding or cfg.get("hidden_act", "silu") != "silu":
        return None
    if layer == LLAMA_LAYER and cfg.get("model_type") in ("llama", "mistral"):
        return "llama"
    if layer == QWEN2_LAYER and cfg.get("model_type") == "qwen2":
        return "qwen2"
    return None


def _rope_type(cfg: dict) -> str:
    return rope_fields(cfg)["rope_parameters"]["rope_type"]


def why_not(fmt: str, src: SourceHead) -> str | None:
    """Why `fmt` cannot hold this head, or None when it can."""
    family = _eagle1_family(src) if src.kind == "eagle1" else None
    layer = f"its decoder layer is {src.config.get('model_type')}'s"
    if fmt == "llamacpp":
        return None if src.kind == "eagle3" else "llama.cpp runs EAGLE-3 drafts only (--spec-type draft-eagle3)"
    if src.kind == "eagle3":
        return None
    if src.config.get("num_hidden_layers", 1) != 1:  # vLLM, SGLang and the official code loop over layers: untested
        return (f"it has {src.config['num_hidden_layers']} decoder layers, and the exports are tested with one-layer "
                "EAGLE-1 heads only (the published heads' kind)")
    if fmt == "official":
        cfg = src.config
        if family != "llama":
            return f"{layer}; the official EAGLE-1 head is a Llama layer without biases (eagle/model/cnets.py)"
        if cfg.get("head_dim") not in (None, cfg["hidden_size"] // cfg["num_attention_heads"]):
            return "its head_dim is not hidden_size / num_attention_heads, which the official code assumes"
        if _rope_type(cfg) not in ("default", "linear", "dynamic"):
            return f"its RoPE scaling {_rope_type(cfg)!r} is not one the official code has (linear, dynamic)"
        return None
    if fmt == "vllm" and family != "llama":
        return f"{layer}; vLLM 0.33.0 runs EAGLE-1 heads of Llama layers only (EagleLlamaForCausalLM)"
    if fmt == "sglang" and family is None:
        return f"{layer}; SGLang 0.5.23 runs EAGLE-1 heads of Llama or Qwen2 layers only"
    return None


def _refuse(fmt: str, src: SourceHead) -> None:
    reason = why_not(fmt, src)
    if reason:
        can = [f for f in FORMATS if f != fmt and why_not(f, src) is None]
        raise EagleError(f"{src.directory}: --format {fmt} cannot hold this {src.label} head: {reason}; "
                         f"formats that can: {', '.join(can) if can else 'none'}")


# -- configs and tensors per format -----------------------------------------------------------------
def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _eagle1_export_config(src: SourceHead, fc_bias: bool, arch: str, family: str) -> dict:
    cfg = eagle1_config(src.config, fc_bias, src.dtype)
    cfg["architectures"] = [arch]
    if family == "llama":  # a Mistral head without sliding window is a Llama layer: readers build Llama's
        cfg["model_type"] = "llama"
        cfg["attention_bias"] = cfg["mlp_bias"] = False
    return cfg


def _eagle3_export(src: SourceHead, head, tables: bool) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json, tensors) in the published EAGLE-3 layout; tables: write d2t and t2d."""
    cfg = head.config_dict()
    cfg["torch_dtype"] = cfg["dtype"] = _dtype_name(src.dtype)
    tensors = {k: src.tensors[k] for k in head.eagle_state_dict() if k not in ("d2t", "t2d")}
    if tables:
        tensors.update(d2t=head.d2t.clone(), t2d=head.t2d.clone())
    return cfg, tensors


def _extras(src: SourceHead, out: Path, exported: bool) -> list[Path]:
    """Copy our extras: the draft vocabulary (into `eaglespec/` when exported) and acceptance.json."""
    written = []
    vocab = vocab_path(src.directory)
    if vocab.is_file():
        dest = out / EXPORTED_DIR / VOCAB_FILE if exported else out / VOCAB_FILE
        dest.parent.mkdir(exist_ok=True)
        written.append(Path(shutil.copyfile(vocab, dest)))
    if (src.directory / ACCEPTANCE).is_file():
        written.append(Path(shutil.copyfile(src.directory / ACCEPTANCE, out / ACCEPTANCE)))
    return written


def _note(text: str) -> None:
    print(f"[eaglespec] note: {text}", file=sys.stderr)


def _target(target):
    """A TargetModel from a path / name (loaded without the tree check), or as given."""
    if target is None or hasattr(target, "embed_tokens"):
        return target
    from ..engine.target import load_target

    return load_target(str(target), check=False)


def _checked(src: SourceHead, target):
    """(head module, target or None): the head built and checked against the target's sizes;
    a different fingerprint is only noted (the same model quantised otherwise differs too)."""
    tgt = _target(target)
    head = build_head(src, None if tgt is None else tgt.config)
    recorded = src.extra.get("target", {}).get("fingerprint") if isinstance(src.extra.get("target"), dict) else None
    if tgt is not None and recorded and recorded != tgt.fingerprint():
        _note(f"{src.directory} was trained for target {src.extra['target'].get('name')!r} (fingerprint {recorded}); "
              f"--target has fingerprint {tgt.fingerprint()}: the sizes agree, check it is the same model")
    return head, tgt


def export_official(head_dir: Path, out: Path, target=None) -> list[Path]:
    """The official EAGLE layout: pytorch_model.bin (eagle-llm 1.2.1 reads no other file) and
    config.json. EAGLE-1 also carries the target's embed_tokens.weight: EaModel loads the head
    with load_state_dict(strict=True) into a module that owns an embedding."""
    src = read_source(head_dir)
    _refuse("official", src)
    if src.kind == "eagle1" and target is None:
        name = (src.extra.get("target") or {}).get("name")
        raise EagleError("--format official: the official EAGLE code (eagle-llm 1.2.1, ea_model.py) loads an "
                         "EAGLE-1 head with strict=True, the target's embed_tokens.weight included: pass --target "
                         f"(the head's target{', e.g. --target ' + name if name else ''})")
    head, tgt = _checked(src, target)
    if src.kind == "eagle1":
        cfg = _eagle1_export_config(src, "fc.bias" in src.tensors, "LlamaForCausalLM", "llama")
        rope = cfg["rope_parameters"]
        cfg["rope_scaling"] = None if rope["rope_type"] == "default" else {"type": rope["rope_type"],
                                                                           "factor": float(rope["factor"])}
        embed = tgt.embed_tokens.weight.detach().to("cpu", src.dtype).contiguous()
        tensors = {"embed_tokens.weight": embed, **src.tensors}
        if cfg["rope_theta"] != 10000.0:
            _note(f"rope_theta is {cfg['rope_theta']:g}: eagle-llm 1.2.1 (cnets.py) fixes the RoPE base at 10000 and "
                  "ignores it; the EAGLE code that reads rope_theta uses it (docs/interop.md)")
    else:
        cfg, tensors = _eagle3_export(src, head, tables=True)
    cfg["eaglespec"] = {**src.extra, "format": "official"}
    (out / CONFIG).write_text(json.dumps(cfg, indent=2, sort_keys=True, default=str))
    torch.save({k: v.contiguous() for k, v in tensors.items()}, out / LEGACY_WEIGHTS)
    return [out / CONFIG, out / LEGACY_WEIGHTS, *_extras(src, out, exported=True)]


def export_vllm(head_dir: Path, out: Path, target=None) -> list[Path]:
    """vLLM 0.33.0's layouts: EAGLE-1 as EagleLlamaForCausalLM reads it (architectures
    LlamaForCausalLM, method "eagle"; its fc has no bias, so ours is dropped), EAGLE-3 as
    LlamaForCausalLMEagle3 (method "eagle3"; d2t only with a reduced vocabulary)."""
    src = read_source(head_dir)
    _refuse("vllm", src)
    head, _ = _checked(src, target)
    if src.kind == "eagle1":
        cfg = _eagle1_export_config(src, False, "LlamaForCausalLM", "llama")
        tensors = {k: v for k, v in src.tensors.items() if k != "fc.bias"}
        if "fc.bias" in src.tensors:
            norm = float(src.tensors["fc.bias"].float().norm())
            _note("vLLM's EAGLE-1 fc has no bias (vllm 0.33.0 llama_eagle.py; it would skip the tensor without a "
                  f"word): this head's fc.bias (L2 norm {norm:.3g}) is dropped, which changes its drafts, not the "
                  "output (docs/interop.md measures it); train with --no-fc-bias for a head that vLLM runs exactly")
    else:
        cfg, tensors = _eagle3_export(src, head, tables=head.config.draft_vocab_size != head.config.vocab_size)
    write_head(out, cfg, tensors, {**src.extra, "format": "vllm"})
    return [out / CONFIG, out / "model.safetensors", *_extras(src, out, exported=True)]


def export_sglang(head_dir: Path, out: Path, target=None) -> list[Path]:
    """SGLang 0.5.23's layouts: EAGLE-1 as LlamaForCausalLMEagle or Qwen2ForCausalLMEagle (their
    fc always has a bias: a head without one gets zeros, the same function), EAGLE-3 as
    LlamaForCausalLMEagle3."""
    src = read_source(head_dir)
    _refuse("sglang", src)
    head, _ = _checked(src, target)
    if src.kind == "eagle1":
        family = _eagle1_family(src)
        arch = "LlamaForCausalLMEagle" if family == "llama" else "Qwen2ForCausalLMEagle"
        cfg = _eagle1_export_config(src, True, arch, family)
        tensors = dict(src.tensors)
        if "fc.bias" not in tensors:
            tensors["fc.bias"] = torch.zeros(src.tensors["fc.weight"].shape[0], dtype=src.dtype)
        extra = {**src.extra, "format": "sglang"}
    else:
        cfg, tensors = _eagle3_export(src, head, tables=head.config.draft_vocab_size != head.config.vocab_size)
        # SGLang 0.5.23 captures the residual stream entering layer i + 1 for each listed id i
        # (models/llama.py, set_eagle3_layers_to_capture), vLLM the one entering layer i, as we do
        # (interfaces.py, _maybe_add_hidden_state): SGLang gets ours minus one; ours stay in our block.
        ids = list(head.config.layer_ids)
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [i - 1 for i in ids]
        cfg.pop("eagle_aux_hidden_state_layer_ids")  # vLLM's and llama.cpp's spelling, in our indexing
        extra = {**src.extra, "format": "sglang", "layer_ids": ids}
    write_head(out, cfg, tensors, extra)
    return [out / CONFIG, out / "model.safetensors", *_extras(src, out, exported=True)]


def export_llamacpp(head_dir: Path, out: Path, target=None) -> list[Path]:
    """llama.cpp's GGUF, written by interop/llamacpp.py (imported only when asked for)."""
    _refuse("llamacpp", read_source(head_dir))
    try:
        from .llamacpp import export_llamacpp as write_gguf
    except ImportError as exc:
        raise EagleError(f"--format llamacpp is not available in this installation ({one_line(exc)}); "
                         "official, vllm and sglang are") from exc
    if target is not None and not isinstance(target, (str, os.PathLike)):
        raise EagleError("--format llamacpp reads the target's files: pass --target as a path (HF folder or .gguf)")
    return write_gguf(Path(head_dir), out, None if target is None else Path(target))


# format -> exporter(head_dir, out_dir, target) -> files written; out_dir exists and is empty
EXPORTERS: dict[str, Callable[..., list[Path]]] = {
    "official": export_official, "vllm": export_vllm, "sglang": export_sglang, "llamacpp": export_llamacpp,
}


# -- one command each ----------------------------------------------------------------------------------
@contextlib.contextmanager
def _staged(out_dir: Path, overwrite: bool):
    """A temporary folder beside out_dir that becomes out_dir when the block succeeds."""
    if out_dir.exists() and not out_dir.is_dir():
        raise EagleError(f"{out_dir} is a file: pass a folder to write the head into")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise EagleError(f"{out_dir} is not empty: pass a new folder, or --overwrite to replace it")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.", suffix=".tmp"))
    os.chmod(tmp, 0o777 & ~_umask())
    try:
        yield tmp
        if out_dir.exists():
            old = tmp.with_suffix(".old")
            os.replace(out_dir, old)
            os.replace(tmp, out_dir)
            shutil.rmtree(old)
        else:
            os.replace(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def _check_paths(source: Path, out_dir: Path) -> None:
    if out_dir.resolve() == source.resolve() or source.resolve() in out_dir.resolve().parents:
        raise EagleError(f"{out_dir} is the head's own folder (or inside it): pass a folder elsewhere")


def export_head(head_dir: str | os.PathLike, out_dir: str | os.PathLike, fmt: str, target=None,
                overwrite: bool = False) -> list[Path]:
    """Write the head in `head_dir` as `fmt` into out_dir -> the files written. target: the
    head's target (a path, a name or a TargetModel): needed by official EAGLE-1 (its embedding)
    and llamacpp, and then checked against the head's sizes."""
    if fmt not in EXPORTERS:
        raise EagleError(f"unknown format {fmt!r}: choose one of {', '.join(FORMATS)}")
    head_dir, out_dir = Path(head_dir), Path(out_dir)
    _check_paths(head_dir, out_dir)
    with _staged(out_dir, overwrite) as tmp:
        files = EXPORTERS[fmt](head_dir, tmp, target)
    return [out_dir / Path(f).relative_to(tmp) for f in files]


@dataclass(frozen=True)
class Imported:
    kind: str           # "eagle1" | "eagle3"
    format: str         # what detect_format found
    files: list[Path]   # what was written, under out_dir


def import_head(source: str | os.PathLike, out_dir: str | os.PathLike, target=None,
                overwrite: bool = False) -> Imported:
    """A head in any exported layout or an official release -> our layout in out_dir (config.json
    + model.safetensors, the extras beside them), checked by our own loader before it is moved
    into place. target: also check it against this target's sizes."""
    source, out_dir = Path(source), Path(out_dir)
    _check_paths(source, out_dir)
    fmt = detect_format(source)
    if fmt == "llamacpp":
        raise EagleError(f"{source}: importing llama.cpp's GGUF is not supported; import the folder it was "
                         "exported from")
    src = read_source(source)
    head, tgt = _checked(src, target)
    if src.kind == "eagle1":
        tensors = dict(src.tensors)
        if "fc.bias" in tensors and not tensors["fc.bias"].any():  # SGLang's stand-in for no bias
            del tensors["fc.bias"]
        cfg = eagle1_config(src.config, "fc.bias" in tensors, src.dtype, head.layers)
    else:
        cfg, tensors = _eagle3_export(src, head, tables=True)
    extra = {**{k: v for k, v in src.extra.items() if k not in ("format", "layer_ids")}, "imported_from": fmt}
    with _staged(out_dir, overwrite) as tmp:
        write_head(tmp, cfg, tensors, extra)
        files = [tmp / CONFIG, tmp / "model.safetensors", *_extras(src, tmp, exported=False)]
        load_head(tmp, None if tgt is None else tgt.config)  # what --head will read
    return Imported(src.kind, fmt, [out_dir / f.relative_to(tmp) for f in files])

