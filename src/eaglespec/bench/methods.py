"""Decoding methods the harness compares. A method is any object with the `Method` attributes and
`run(input_ids, max_new_tokens, sampling) -> Record`; each is timed the same way (device
synchronised on a GPU, prefill included) and its tokens are the generated ids it returns."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Protocol

import torch

from ..core.config import DynamicTreeSpec, SamplingParams, parse_tree
from ..engine.decoding import EagleGenerator, GenerationResult
from ..errors import EagleError
from .metrics import Record

BASELINE = "vanilla"
EAGER = "vanilla-eager"
HF_GENERATE = "hf-generate"
HF_PROMPT_LOOKUP = "hf-prompt-lookup"
LLAMA_CPP = "llama.cpp"          # llama.cpp's vanilla decoding of the target's GGUF as it is (the default's Q4_1)
LLAMA_CPP_F32 = "llama.cpp-f32"  # the same of an F32 copy: the weights eaglespec's fp32 target runs
PROMPT_LOOKUP_TOKENS = 10
AUTO_FIXED = "auto-fixed"      # --tree auto's tuned tree without the adaptive policy: what the policy adds
AUTO_WHOLE = "auto-whole"      # --tree auto with every step's whole tree (no confidence floor): what the floor adds
AUTO_STATIC = "auto-static"    # --tree auto with the tuned trees' static shapes (no EAGLE-2 growth): what the growth adds
AUTO_FLOOR = "auto-floor"      # auto-floor:P, --tree auto with the confidence floor P instead of the tuned one
TUNED_VARIANTS = (AUTO_FIXED, AUTO_WHOLE, AUTO_STATIC)
DEFAULT_METHODS = "vanilla,auto,eagle1,chain,dynamic,hf,pld"
METHODS_HELP = (
    "comma-separated: vanilla (our loop without a drafter, the baseline; always run), eagle1, chain (one "
    "method per --chain depth), chain:N, dynamic, dynamic:K,D,N, auto (the tree tuned for this machine), "
    f"{AUTO_FIXED} (the tuned tree kept for every step: what the adaptive policy adds), "
    f"{AUTO_WHOLE} (auto drafting its whole tree every step, --draft-floor 0: what the confidence floor adds), "
    f"{AUTO_STATIC} (auto drafting the tuned trees' static shapes, not grown EAGLE-2 style: what that growth adds), "
    f"{AUTO_FLOOR}:P (auto with the confidence floor P, as --draft-floor P: floors side by side in one run), "
    "default (the --tree of the generator), eager (vanilla on the eager kernels, beside a compiled baseline), "
    f"hf ({HF_GENERATE}, greedy), pld ({HF_PROMPT_LOOKUP}, greedy), {LLAMA_CPP} (llama-server decoding the "
    f"target's .gguf as it is, greedy), {LLAMA_CPP_F32} (the same of an F32 copy); the llama.cpp methods need "
    f"`python -m eaglespec.interop.build_llamacpp` first. Default: {DEFAULT_METHODS}"
)
_ALIASES = {"hf": HF_GENERATE, "pld": HF_PROMPT_LOOKUP, "eager": EAGER, "llamacpp": LLAMA_CPP,
            "llamacpp-f32": LLAMA_CPP_F32}


class Method(Protocol):
    name: str          # column in every table and plot
    kind: str          # "baseline" | "lossless" (must equal the baseline under greedy) | "reference" (outside code: a mismatch is a warning)
    spec: str          # what it runs, for the metadata
    depth: int         # deepest draft level (n-alpha is reported up to it); 0 without a drafter
    greedy_only: bool  # skipped at temperature > 0

    def run(self, input_ids: list[int], max_new_tokens: int, sampling: SamplingParams) -> Record: ...


def synchronize(device: torch.device) -> None:
    """Only the benchmark waits for the device: timings must include queued GPU work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class LoopMethod:
    """eaglespec's own generation loop: vanilla (tree None) or EAGLE with a given tree."""

    greedy_only = False

    def __init__(self, gen: EagleGenerator, name: str, tree=None):
        self.gen, self.name, self.tree = gen, name, tree
        self.kind = "baseline" if tree is None else "lossless"
        self.spec = "no drafter" if tree is None else name
        if name == "auto" or _tuned_variant(name):  # the tuned tree, floor and growth: a resumed run must use the same
            self.spec = f"{name}: {str(tree) if isinstance(tree, DynamicTreeSpec) else [list(p) for p in tree.paths]}"
            attr, value = TunedVariant.setting_of(name) if name != "auto" else (None, None)
            floor = value if attr == "draft_floor" else gen.floor_for(tree)
            rerank = 0 if attr == "rerank" else gen.rerank_for(tree)
            self.spec += f", floor {floor:g}" if floor > 0 else ""
            self.spec += f", grown as top-{rerank}" if rerank else ""
        self.depth = int(getattr(tree, "depth", 0) or 0)

    def run(self, input_ids: list[int], max_new_tokens: int, sampling: SamplingParams) -> Record:
        device = self.gen.target.device
        result = GenerationResult()
        synchronize(device)
        start = time.perf_counter()
        for step in self.gen.stream(input_ids, max_new_tokens, sampling, tree=self.tree, speculative=self.tree is not None):
            result.add(step)
        synchronize(device)
        steps = result.steps
        return Record(result.token_ids, time.perf_counter() - start, [s.accepted for s in steps],
                      [s.emitted for s in steps], [s.tree_size for s in steps])


class EagerVanilla(LoopMethod):
    """Vanilla decoding on the eager kernels, beside a compiled generator's own vanilla (the
    baseline): the gain from compiling and the gain from EAGLE, each visible. A reference, since
    other kernels may break a rounding-level near-tie the other way."""

    kind = "reference"

    def __init__(self, gen: EagleGenerator):
        super().__init__(gen, EAGER)
        self.kind, self.spec = "reference", "no drafter, eager kernels"

    def run(self, input_ids: list[int], max_new_tokens: int, sampling: SamplingParams) -> Record:
        from ..engine.target import EagerSteps

        target = self.gen.target
        compiled, target.steps = target.steps, EagerSteps(target)
        try:
            return super().run(input_ids, max_new_tokens, sampling)
        finally:
            target.steps = compiled


class TunedVariant(LoopMethod):
    """--tree auto's tuned tree with one generator setting changed while it runs: `auto-fixed`
    (adaptive=False: the tuned tree on every step, without tuning.AdaptiveTree moving between
    sizes), `auto-whole` (draft_floor=0: every drafting step drafts its whole tree),
    `auto-static` (rerank=False: the tuned trees' static shapes, with the floor cutting nodes) and
    `auto-floor:P` (draft_floor=P). Beside `auto`, the difference is what the adaptive policy, the
    confidence floor, the EAGLE-2 growth or another floor adds or costs."""

    SETTINGS = {AUTO_FIXED: ("adaptive", False), AUTO_WHOLE: ("draft_floor", 0.0), AUTO_STATIC: ("rerank", False)}

    def __init__(self, gen: EagleGenerator, name: str):
        self.setting = self.setting_of(name)
        super().__init__(gen, name, gen.tree)

    @classmethod
    def setting_of(cls, name: str) -> tuple[str, object]:
        """A variant's name -> the generator attribute it changes and its value."""
        if name in cls.SETTINGS:
            return cls.SETTINGS[name]
        text = name.removeprefix(AUTO_FLOOR + ":")
        try:
            floor = float(text)
        except ValueError:
            floor = -1.0
        if not 0.0 <= floor < 1.0:
            raise EagleError(f"method {name!r}: {AUTO_FLOOR}:P takes a confidence floor P in [0, 1), such as "
                             f"{AUTO_FLOOR}:0.1")
        return "draft_floor", floor

    @contextlib.contextmanager
    def applied(self):
        """The generator with this variant's setting, restored after."""
        attr, value = self.setting
        before = getattr(self.gen, attr)
        setattr(self.gen, attr, value)
        try:
            yield
        finally:
            setattr(self.gen, attr, before)

    @property
    def shapes_of_its_own(self) -> bool:
        """Whether it runs steps `auto`'s warm-up does not build: `auto-static`'s head steps draft
        the tuned trees' static shapes (the floor and the adaptive policy change no step's shape:
        the warm-up drafts whole trees of every tuned size)."""
        return self.setting[0] == "rerank"

    def run(self, input_ids: list[int], max_new_tokens: int, sampling: SamplingParams) -> Record:
        with self.applied():
            return super().run(input_ids, max_new_tokens, sampling)


def warm_methods(gen: EagleGenerator, methods: list, contexts: tuple[int, ...]) -> None:
    """Build (or load) every compiled step the methods will run before any is timed: the
    generator's own warm-up with the methods' trees, then again under each tuned variant that
    drafts shapes of its own (its drafting steps only: vanilla's are built by then)."""
    gen.warm(contexts, trees=tuple(m.tree for m in methods if isinstance(m, LoopMethod) and m.tree is not None))
    for m in methods:
        if isinstance(m, TunedVariant) and m.shapes_of_its_own:
            with m.applied():
                gen.warm(contexts, vanilla=False)


class HFMethod:
    """transformers' own `generate` on the same model: greedy, or prompt-lookup decoding."""

    kind = "reference"
    greedy_only = True
    depth = 0

    def __init__(self, gen: EagleGenerator, name: str, prompt_lookup_tokens: int | None = None):
        self.gen, self.name, self.prompt_lookup_tokens = gen, name, prompt_lookup_tokens
        self.spec = "transformers generate, greedy" + (
            f", prompt_lookup_num_tokens={prompt_lookup_tokens}" if prompt_lookup_tokens else "")

    def run(self, input_ids: list[int], max_new_tokens: int, sampling: SamplingParams) -> Record:
        from transformers import GenerationConfig

        if not sampling.greedy:
            raise EagleError(f"{self.name} is run greedy only")
        target = self.gen.target
        eos = sorted(self.gen.eos_token_ids())  # the same stops as our loop
        extra = {"prompt_lookup_num_tokens": self.prompt_lookup_tokens} if self.prompt_lookup_tokens else {}
        config = GenerationConfig(max_new_tokens=min(max_new_tokens, target.max_context - len(input_ids)),
                                  do_sample=False, eos_token_id=eos or None, pad_token_id=eos[0] if eos else 0, **extra)
        ids = torch.tensor([input_ids], device=target.device)
        synchronize(target.device)
        start = time.perf_counter()
        out = target.model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
        synchronize(target.device)
        elapsed = time.perf_counter() - start
        return Record(out[0, len(input_ids):].tolist(), elapsed)


def build_methods(gen: EagleGenerator, names: str, chains: list[int], greedy: bool,
                  default_tree: str = "eagle1", servers: contextlib.ExitStack | None = None,
                  gguf: Path | None = None) -> tuple[list[Method], list[str]]:
    """Parse --methods; -> (methods, notes for the user). Vanilla is always first (the baseline);
    greedy-only references are dropped at temperature > 0. The llama.cpp methods start a
    llama-server on `gguf` (the target's file) each, entered into `servers` (closed with it)."""
    notes: list[str] = []
    wanted = method_names(names, chains, default_tree)
    if BASELINE not in wanted:
        notes.append("vanilla added: it is the baseline of the speedup and of the losslessness check")
    wanted = [BASELINE] + [w for w in wanted if w != BASELINE]
    methods: list[Method] = []
    for name in wanted:
        if name == BASELINE:
            methods.append(LoopMethod(gen, BASELINE))
        elif name == EAGER:
            methods.append(EagerVanilla(gen))
        elif _tuned_variant(name):
            if gen.tuned is None:
                raise EagleError(f"method {name!r} is the tree --tree auto tuned, and this generator has none: "
                                 "run with --tree auto (the default) and a head with acceptance.json")
            methods.append(TunedVariant(gen, name))
        elif name in (HF_GENERATE, HF_PROMPT_LOOKUP):
            if not greedy:
                notes.append(f"{name} skipped: outside references run greedy only")
                continue
            methods.append(HFMethod(gen, name, PROMPT_LOOKUP_TOKENS if name == HF_PROMPT_LOOKUP else None))
        elif name in (LLAMA_CPP, LLAMA_CPP_F32):
            if not greedy:
                notes.append(f"{name} skipped: outside references run greedy only")
                continue
            methods.append(_llama_method(name, gguf, servers))
        else:
            # once per method: the generator caches a drafter per tree
            tree = gen.tree if name == "auto" else parse_tree(name)
            if gen.head is None and gen.drafter is None:
                raise EagleError(f"method {name!r} needs an EAGLE head, and the generator has none")
            label = str(tree) if isinstance(tree, DynamicTreeSpec) else name  # 'dynamic' -> 'dynamic:4,4,12'
            if all(m.name != label for m in methods):
                methods.append(LoopMethod(gen, label, tree))
    return methods, notes


def method_names(names: str, chains: list[int], default_tree: str = "eagle1") -> list[str]:
    """--methods as the names `build_methods` runs (aliases resolved, `chain` expanded, each once),
    each checked without a model, so that a typo is refused before the target loads."""
    wanted: list[str] = []
    for raw in split_methods(names):
        if raw == "chain":
            if not chains:
                raise EagleError("method 'chain' needs --chain depths, e.g. --chain 3,5")
            wanted += [f"chain:{d}" for d in chains]
        else:
            wanted.append(_ALIASES.get(raw, default_tree if raw == "default" else raw))
    wanted = list(dict.fromkeys(wanted))
    for name in wanted:
        if name in (BASELINE, EAGER, HF_GENERATE, HF_PROMPT_LOOKUP, LLAMA_CPP, LLAMA_CPP_F32, "auto") or _tuned_variant(name):
            continue
        try:
            tree = parse_tree(name)
        except EagleError:
            if ":" in name:  # a tree with arguments: the tree's own message says what is wrong with them
                raise
            raise EagleError(f"--methods: unknown method {name!r}; {METHODS_HELP}") from None
        if tree is None:
            raise EagleError(f"method {name!r} is vanilla decoding; use 'vanilla'. {METHODS_HELP}")
    return wanted


def check_llamacpp(names: str, target: str | None, greedy: bool = True) -> Path | None:
    """When --methods names a llama.cpp method that will run (greedy): check that llama.cpp is built
    (with llama-quantize when the F32 copy is still to be made) and that the target is a .gguf
    file, in one line each, before the target loads; -> that file (None otherwise)."""
    wanted = {_ALIASES.get(n, n) for n in split_methods(names)} & {LLAMA_CPP, LLAMA_CPP_F32}
    if not wanted or not greedy:
        return None
    from ..engine.target import resolve_target
    from ..interop.build_llamacpp import ROOT_ENV, binary, server
    from ..interop.llamacpp import f32_path

    server()
    folder, gguf = resolve_target(target)
    if gguf is None:
        raise EagleError(f"the llama.cpp methods run llama.cpp on the target's .gguf file, and {target} is a Hugging Face "
                         "folder: pass --target FILE.gguf, or leave the llama.cpp methods out")
    path = Path(folder) / gguf
    tool = binary("llama-quantize")
    if LLAMA_CPP_F32 in wanted and not f32_path(path).is_file() and not os.access(tool, os.X_OK):
        raise EagleError(f"{LLAMA_CPP_F32} needs {tool} to make its F32 copy: run `python -m "
                         f"eaglespec.interop.build_llamacpp` again (it adds it to the build), or set {ROOT_ENV}")
    return path


def _llama_method(name: str, gguf: Path | None, servers: contextlib.ExitStack | None) -> Method:
    """llama.cpp's vanilla decoding on this machine's threads, of the target's GGUF or its F32 copy."""
    from ..interop.llamacpp import LlamaCppMethod, LlamaServer, f32_gguf

    if gguf is None:
        raise EagleError(f"method {name!r} needs the target's .gguf file (check_llamacpp)")
    if servers is None:
        raise EagleError(f"method {name!r} needs a place to keep its llama-server (build_methods(servers=...))")
    model = f32_gguf(gguf) if name == LLAMA_CPP_F32 else Path(gguf)
    threads = torch.get_num_threads()
    running = servers.enter_context(LlamaServer(model, threads=threads))  # its binary: build_llamacpp.server()
    # the spec names no port nor cache path: a resumed run compares it
    copy = "an F32 copy of " if name == LLAMA_CPP_F32 else ""
    return LlamaCppMethod(running, name, spec=f"llama-server {copy}{Path(gguf).name}, {threads} threads, greedy")


def _tuned_variant(name: str) -> bool:
    return name in TUNED_VARIANTS or name.startswith(AUTO_FLOOR + ":")


def split_methods(text: str) -> list[str]:
    """'vanilla,dynamic:4,6,30,hf' -> ['vanilla', 'dynamic:4,6,30', 'hf']: a bare number continues
    the previous item's arguments."""
    items: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if part.isdigit() and items and ":" in items[-1]:
            items[-1] += "," + part
        elif part:
            items.append(part)
    return items


def parse_depths(text: str) -> list[int]:
    try:
        depths = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise EagleError(f"--chain takes comma-separated depths such as 3,5, got {text!r}") from exc
    if any(d < 1 for d in depths):
        raise EagleError(f"--chain depths must be >= 1, got {text!r}")
    return depths
