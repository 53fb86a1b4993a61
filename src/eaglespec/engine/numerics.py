"""Numerics chosen for the hardware, never silently: the dtype the target and head run in, and
whether verification in it is batch-invariant.

Lossless EAGLE rests on one fact: the target's logits for a token verified inside a q-token tree
equal its logits when the same token is decoded alone. Kernels do not promise that: a matrix
product over q rows may block and round differently from one over a single row, and bf16 rounds
coarsely enough for that to flip a near-tie. So we measure it, per machine, dtype and tree size:
the per-row logits of a q-token forward (a chain over a 256-token cache) against the same tokens
run one at a time. A size is *exact* when the two are bitwise equal or differ only by fp32's
summation order (see `Invariance.exact`); we record the largest difference and whether every
row's argmax agrees. `--tree auto` only uses exact sizes
unless `--allow-inexact` ("lossless up to floating-point rounding", the standard GPU engines
keep).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from ..errors import EagleError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CONTEXT = 256  # cached tokens the measurement runs on
EXACT_RTOL = 1e-4  # see Invariance.exact


@dataclass(frozen=True)
class Invariance:
    size: int            # q: tokens verified together (a tree of q - 1 draft nodes plus its root)
    max_diff: float      # largest |logit difference| between the q-token forward and one at a time
    argmax_agrees: bool  # every row's argmax is the same both ways
    bitwise: bool        # the logits are identical
    scale: float = 1.0   # the largest |logit| seen (differences are judged against it)

    @property
    def exact(self) -> bool:
        """Bitwise equal, or equal up to the order of fp32 accumulation: every argmax agrees and
        no logit moved by more than EXACT_RTOL of the logit scale. That bound is ~1,000 fp32 unit
        roundoffs and ~80x below one bf16 roundoff, so it separates summation-order noise from
        rounding of the activations themselves."""
        return self.bitwise or (self.argmax_agrees and self.max_diff <= EXACT_RTOL * max(1.0, self.scale))


@dataclass(frozen=True)
class NumericsReport:
    dtype: str
    rows: tuple[Invariance, ...]

    def exact_sizes(self) -> list[int]:
        return [r.size for r in self.rows if r.exact]

    def largest_exact(self) -> int:
        """The largest q such that every measured size up to it is exact (1 at least)."""
        best = 1
        for r in sorted(self.rows, key=lambda r: r.size):
            if not r.exact:
                break
            best = r.size
        return best

    def tree_limit(self) -> int | None:
        """The most tokens a tree may verify at once, or None where every measured size is exact
        (the compiled step is measured on the sizes it will verify: its query buckets up to --tree
        auto's largest, and EAGLE-1's tree's for a head that was never tuned)."""
        best = self.largest_exact()
        return None if best == max(r.size for r in self.rows) else best

    def to_dict(self) -> dict:
        return {"dtype": self.dtype, "rows": [asdict(r) for r in self.rows]}


# the cache lengths a measurement starts from: spread over the residues of the kernels' blocks (bf16
# siblings on the Intel AMX kind were bitwise equal at 40, 130, 200 and 256 slots, not at 83)
CONTEXT_OFFSETS = (0, 5, 11, 18, 27, 37, 46, 59)


@torch.no_grad()
def measure_invariance(target, sizes=(1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32), context: int = CONTEXT,
                       seed: int = 0, reference=None, offsets: tuple[int, ...] | None = None) -> NumericsReport:
    """Per-row logits of a q-token step against the same tokens decoded one at a time, for each q
    in sizes, in two tree shapes: a chain (token i after tokens 0..i-1) and a star (tokens 1..q-1
    each a child of token 0, as a draft tree's siblings are), on caches of `context` + each of
    `offsets` random tokens (default: CONTEXT_OFFSETS, read at the call, as numerics_for's cache key
    reads it); the largest difference over all of them is reported. Both run through
    the target's decoding step (`target.steps`: eager or compiled), so a compiled target is
    measured on its own kernels. A sibling sits in a slot after the others, while decoded alone it
    sits right after its parent: a kernel can round it otherwise at some cache lengths and not at
    others (bf16 on the Intel AMX kind: siblings differ by up to 0.37 after 83 cached tokens and
    not after 256), which a chain, or one cache length, does not show.
    reference: another backend (target.EagerSteps) whose one-at-a-time logits replace this
    one's as the reference: compiled against eager."""
    offsets = CONTEXT_OFFSETS if offsets is None else offsets
    g = torch.Generator().manual_seed(seed)
    vocab = min(target.vocab_size, int(getattr(target.config, "vocab_size", target.vocab_size)))
    longest = max(sizes)
    top = target.max_context - longest - 1
    found: dict[int, list] = {q: [] for q in sizes}  # q -> (diff, argmax agrees, scale) at each length
    for length in sorted({max(1, min(context + o, top)) for o in offsets}):
        prefix = torch.randint(0, vocab, (1, length), generator=g)
        tokens = torch.randint(0, vocab, (1, longest), generator=g)
        for q, row in _invariance_at(target, prefix, tokens, sizes, reference).items():
            found[q].append(row)
    out = []
    for q, rows in found.items():
        diff = max(d for d, _, _ in rows)
        out.append(Invariance(q, diff, all(a for _, a, _ in rows), diff == 0.0, max(s for _, _, s in rows)))
    return NumericsReport(str(target.dtype).removeprefix("torch."), tuple(out))


@torch.no_grad()
def _invariance_at(target, prefix, tokens, sizes, reference) -> dict[int, tuple[float, bool, float]]:
    """measure_invariance after one prefix: q -> (largest logit difference, every argmax agrees,
    the reference's largest logit). The one-at-a-time references are computed once, for the
    largest q: token i's logits alone depend only on the tokens before it, so every smaller q
    compares against its first rows."""
    context, longest = prefix.shape[1], tokens.shape[1]
    one, first = torch.ones(1, 1, 1, dtype=torch.bool), torch.zeros(1, 1, dtype=torch.long)

    def rows_of(steps):
        cache = target.new_cache()
        target.forward(prefix, cache)
        return steps.start_rows(cache, [context], context + longest + 1)

    steps = target.steps if reference is None else reference
    rows = rows_of(steps)

    def alone(i):  # token i decoded alone, in the next slot
        _, (step,) = steps.verify_rows(tokens[:, i:i + 1], rows, one, first, [1])
        return step

    chain = []
    for i in range(longest):  # the chain: each token kept before the next
        slot = rows.length
        chain.append(alone(i))
        rows.keep_paths(slot, [torch.arange(1)])
    chain = torch.cat(chain)  # [longest, V]
    siblings = [chain[0]]
    for i in range(1, longest):  # the star: token 0 kept, then each other token alone right after it
        rows.crop(context + 1)
        siblings.append(alone(i)[0])
    siblings = torch.stack(siblings)

    rows = rows_of(target.steps)
    out = {}
    for q in sizes:
        diff, agrees, scale = 0.0, True, 0.0
        star = torch.eye(q, dtype=torch.bool)
        star[:, 0] = True
        shapes = [(torch.ones(q, q, dtype=torch.bool).tril(), torch.arange(q), chain[:q])]
        if q > 2:  # with two tokens the star is the chain
            shapes.append((star, (torch.arange(q) > 0).long(), siblings[:q]))
        for mask, depth, ref in shapes:
            rows.crop(context)
            _, (together,) = target.steps.verify_rows(tokens[:, :q], rows, mask[None], depth[None], [q])
            diff = max(diff, (together - ref).abs().max().item())
            agrees = agrees and bool((together.argmax(-1) == ref.argmax(-1)).all())
            scale = max(scale, ref.abs().max().item())
        out[q] = (diff, agrees, scale)
    return out


def parse_dtype(name: str) -> str:
    if name != "auto" and name not in DTYPES:
        raise EagleError(f"--dtype {name!r}: choose auto, {', '.join(DTYPES)}")
    return name


def check_dtype_runs(name: str, device: str) -> None:
    """Refuse a dtype this hardware cannot run (or runs only by slow emulation, said so)."""
    from .target import native_bf16_cpu

    if name == "float16" and not str(device).startswith("cuda"):
        raise EagleError("--dtype float16 needs a GPU: CPUs have no fp16 matrix units in PyTorch; "
                         "use --dtype bfloat16 (on a CPU with AVX512-BF16 or AMX) or float32")
    if name == "bfloat16" and not str(device).startswith("cuda") and not native_bf16_cpu():
        raise EagleError("--dtype bfloat16: this CPU has no native bf16 units (AVX512-BF16 or AMX), so it "
                         "would be emulated and slower than float32; use --dtype float32 (or auto)")


SIZES = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 65)  # q = tree nodes + root, up to tuning's largest tree


def numerics_for(target, sizes=None, retune: bool = False) -> NumericsReport:
    """`measure_invariance` for this target on its decoding step's kernels (target.steps), cached
    beside the cost curves (files.cache_dir), keyed by the machine, software, threads, weights,
    dtype, quantization and kernels. sizes: by default the ones --tree auto may verify on those
    kernels (the compiled step's query buckets, or SIZES)."""
    sizes = tuple(sizes or getattr(target.steps, "invariance_sizes", None) or SIZES)
    import hashlib
    import json

    import transformers

    from ..files import atomic_write_bytes, cache_dir
    from .target import cpu_identity
    from .tuning import retune_requested

    # scheme 2: reports no longer carry a step time (choose_dtype times the dtypes side by side);
    # scheme 3: sibling rows measured too (a star tree beside the chain), at 8 cache lengths
    key = {"scheme": 3, **cpu_identity(), "device": str(target.device), "threads": torch.get_num_threads(),
           "torch": torch.__version__, "transformers": transformers.__version__, "target": target.fingerprint(),
           "dtype": str(target.dtype), "quantization": target.quantization, "sizes": list(sizes), "context": CONTEXT,
           "offsets": list(CONTEXT_OFFSETS),
           "steps": target.steps.kernels}
    path = cache_dir() / f"numerics-{hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]}.json"
    if path.is_file() and not (retune or retune_requested()):
        try:
            data = json.loads(path.read_text())
            if data["key"] == key:
                r = data["report"]
                return NumericsReport(r["dtype"], tuple(Invariance(**row) for row in r["rows"]))
        except (OSError, ValueError, KeyError, TypeError):
            pass  # damaged: measure again and rewrite
    report = measure_invariance(target, sizes)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, json.dumps({"key": key, "report": report.to_dict()}, indent=1).encode())
    except OSError:
        pass  # an unwritable cache only costs the next start a measurement
    return report


@torch.no_grad()
def step_times(targets: dict, context: int = 64, reps: int = 6) -> dict[str, float]:
    """The fastest single-token step of each target, measured alternately so that a shared
    machine's load falls on all of them alike. -> name -> seconds."""
    g = torch.Generator().manual_seed(0)
    first = next(iter(targets.values()))
    prompt = torch.randint(0, min(first.vocab_size, 1000), (1, context), generator=g)
    caches = {}
    for name, t in targets.items():
        caches[name] = t.new_cache()
        t.forward(prompt, caches[name])
    best = {name: float("inf") for name in targets}
    token = prompt[:, -1:]
    for _ in range(reps):
        for name, t in targets.items():
            start = time.perf_counter()
            t.logits(t.forward(token, caches[name]))
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def choose_dtype(target, device: str, retune: bool = False) -> tuple[object, NumericsReport, str]:
    """dtype 'auto': of float32 and (on CUDA, or a CPU with native bf16 units) bfloat16, the one
    with the fastest vanilla step among those where trees of 2 tokens or more verify exactly;
    float32 when none does. target: loaded in float32. -> (target in the chosen dtype, its
    invariance report, the reason, one line)."""
    import copy

    from .target import TargetModel, native_bf16_cpu

    reports = {"float32": numerics_for(target, retune=retune)}
    candidates = {"float32": target}
    if str(device).startswith("cuda") or native_bf16_cpu():
        low = TargetModel(copy.deepcopy(target.model).to(torch.bfloat16), target.tokenizer, target.name,
                          target.quantization)
        candidates["bfloat16"] = low
        reports["bfloat16"] = numerics_for(low, retune=retune)
    usable = [name for name, r in reports.items() if r.largest_exact() >= 2]
    steps = step_times(candidates)  # now, side by side: a cached time would carry another moment's load
    chosen = min(usable, key=lambda n: steps[n]) if usable else "float32"
    facts = "; ".join(f"{n}: vanilla step {steps[n] * 1000:.1f} ms, exact up to {r.largest_exact()} tokens"
                      for n, r in reports.items())
    why = ("the fastest with exact trees" if chosen in usable else
           "no dtype verifies 2 tokens exactly on this machine: trees need --allow-inexact")
    return candidates[chosen], reports[chosen], f"dtype auto: {chosen} ({why}; {facts})"


def main(argv: list[str] | None = None) -> None:
    """`python -m eaglespec.engine.numerics [--compile auto|on|off]`: the invariance table of
    docs/numerics.md for the default model, in every format this machine runs (cached measurements
    are reused), then the compiled step's two rows where the compiled path runs."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m eaglespec.engine.numerics", description=main.__doc__.split(": ", 1)[1])
    parser.add_argument("--compile", choices=("auto", "on", "off"), default="auto",
                        help="the compiled rows: where the compiled path runs (auto), always (on: an error where it "
                             "cannot), or none (off)")
    args = parser.parse_args(argv)

    from .compiled import CompiledSteps, artefact_dir, compile_mode, resolve_mode
    try:  # before the minutes of measuring: --compile on where it cannot run is one line
        on, why = resolve_mode(compile_mode(args.compile), torch.device("cpu"))
    except EagleError as exc:
        raise SystemExit(str(exc)) from None
    from .quant import quantize_target
    from .target import EagerSteps, load_target, native_bf16_cpu

    formats = [("float32", torch.float32, None), ("int8 weight-only (fp32 compute)", torch.float32, "int8")]
    if native_bf16_cpu():
        formats.insert(1, ("bfloat16", torch.bfloat16, None))
    print("| dtype | " + " | ".join(str(q) for q in SIZES) + " | exact up to |")
    print("|---|" + "---|" * len(SIZES) + "---:|")
    for label, dtype, quantization in formats:
        target = load_target(None, dtype)
        quantize_target(target, quantization)
        report = numerics_for(target)
        cells = " | ".join(f"{r.max_diff:.2g}{'' if r.exact else ' ✗'}" for r in report.rows)
        print(f"| {label} | {cells} | {report.largest_exact()} |", flush=True)
    # the compiled step (fp32; query sizes up to its buckets): against its own q = 1, and against eager
    if not on:
        print(f"(no compiled rows: {why})")
        return
    target = load_target(None)
    target.steps = CompiledSteps(target, folder=artefact_dir(target)[0])
    sizes = tuple(q for q in SIZES if q <= 16)
    for label, reference in (("float32 compiled, against compiled q = 1", None),
                             ("float32 compiled, against eager q = 1", EagerSteps(target))):
        report = measure_invariance(target, sizes, reference=reference)
        cells = " | ".join(f"{r.max_diff:.2g}{'' if r.exact else ' ✗'}" for r in report.rows)
        cells += " | -" * (len(SIZES) - len(sizes))
        print(f"| {label} | {cells} | {report.largest_exact()} |", flush=True)


if __name__ == "__main__":
    main()
