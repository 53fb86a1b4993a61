"""`eaglespec certify`: a lossless certificate for a target and its EAGLE head, on this machine, in
this dtype, with this tree. The way to check a new model or head before serving it.

Four checks, one page (printed, and saved as certificate.json and certificate.md):
  1. greedy identity   EAGLE against vanilla decoding on N prompts (a built-in mix of tasks or the
                       user's JSONL). Each first divergence is measured with a plain forward of the
                       target on prompt + common prefix (`device_check.find_divergence`) and called
                       a floating-point near-tie when both tokens' logits lie within the threshold
                       of the top logit (for the two best tokens: the top-2 gap is below it), else
                       a real defect. The threshold depends on the dtype (`near_tie_rule`).
  2. sampling          the first verified tokens drawn many times with EAGLE and with vanilla
                       decoding, at temperature 1 and at temperature 0.7 / top-p 0.9, per prompt;
                       a two-sample chi-square test of homogeneity on the 2 x K table of outcomes.
  3. batch invariance  `numerics.measure_invariance` for every tree size 1..N the generator may
                       verify: how far a token's logits inside a q-token forward are from the same
                       token run alone. A size that is not bitwise equal is where near-ties come from.
  4. reproducible      sampled identity in the reproducible sampling mode: per sampling prompt and
     sampling          setting, one seed, EAGLE alone and EAGLE in a batch of every sampling prompt
                       against seeded vanilla sampling, token for token; a divergence is judged as in
                       check 1, on the perturbed target (logits + temperature x keyed Gumbel noise).

Verdict: FAIL (exit 1) on a real greedy or reproducible-sampling defect, or on a sampling test with
p < ALPHA / m (m tests run, Bonferroni). Near-ties are listed but pass: which of two tokens within rounding of each other
comes out depends on how a kernel blocks its sums, so vanilla decoding with another batch shape
could pick either one ("lossless up to floating-point rounding", the standard GPU engines keep).
The batch-invariance table informs; it does not fail the certificate.

Symbols as in verify.py: p the target's processed distribution, accepted / recovered / bonus tokens.
"""

from __future__ import annotations

import copy
import json
import math
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ..errors import EagleError
from ..files import atomic_write_bytes, output_folder

# One or two prompts per kind of task users send, written for this check.
BUILTIN_PROMPTS = (
    "Hi! Can you recommend a good book for a long train journey?",                                  # chat
    "Write a short, friendly reply declining an invitation to a party on Saturday.",                # writing
    "Write a Python function that returns the n-th Fibonacci number iteratively.",                  # code
    "What does this JavaScript print, and why? console.log([1, 2, 3].map(x => x * 2).join('-'))",   # code reading
    "Write a SQL query that counts the orders per customer in a table orders(id, customer_id).",    # code
    "A shop sells pens at 3 dollars each. How much do 7 pens cost? Show your working.",             # math
    "Solve for x: 5x - 4 = 21.",                                                                    # math
    "Translate into French: 'The library opens at nine and closes at six.'",                        # translation
    "Translate into English: 'Der Zug hat zehn Minuten Verspätung.'",                               # translation
    "Summarise in one sentence: The city council voted on Tuesday to extend the bike lane network "
    "by 40 kilometres over the next three years, funded by a new parking fee in the centre.",       # summarization
    "What is the capital of Australia?",                                                            # factual QA
    "Why do leaves change colour in autumn? Answer in two sentences.",                              # science QA
    "List three differences between a virus and a bacterium.",                                      # STEM
    "Extract the names and ages as JSON: 'Ana is 31, her brother Luis is 27.'",                     # extraction
    "If all bloops are razzies and all razzies are lazzies, are all bloops lazzies? Explain.",      # reasoning
    "Write a four-line poem about the sea at night.",                                               # creative
)
SAMPLING_SETTINGS = ((1.0, 1.0), (0.7, 0.9))  # (temperature, top_p) of the sampling check
ALPHA = 1e-3                                  # the sampling check's false-alarm rate, over all its tests
CERTIFICATE_SAMPLES = 1000                    # draws per test below which the report calls itself a smoke test
MIN_EXPECTED = 5.0                            # chi-square cells with a smaller expected count are pooled
# Near-tie threshold in float32 / float64: this times max(1, |top logit|) (rounding errors scale with the values
# summed). bf16 and fp16: the invariance check's largest difference, at least HALF_FLOOR.
RELATIVE_TIE = {torch.float32: 1e-3, torch.float64: 1e-9}
HALF_FLOOR = 0.1
SAY_PREFIX = "[certify]"


@dataclass(frozen=True)
class CertifySettings:
    max_new_tokens: int = 64            # greedy check: new tokens per prompt
    sample_prompts: int = 3             # sampling check: prompts, spread over the greedy check's
    samples: int = CERTIFICATE_SAMPLES  # sampling check: draws per method, prompt and setting
    sample_tokens: int = 2              # a draw is the first K tokens; the outcome tested is tokens 2..K
    batch_size: int = 100               # copies of a prompt decoded together while sampling
    seed: int = 0                       # EAGLE's draw i uses seed + i, vanilla's seed + samples + i
    sizes: tuple[int, ...] | None = None  # invariance check's tree sizes; None = 1..the tree's nodes

    def check(self) -> None:
        for name in ("max_new_tokens", "sample_prompts", "samples", "batch_size"):
            if getattr(self, name) < 1:
                raise EagleError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.sample_tokens < 2:
            raise EagleError(f"--sample-tokens must be >= 2 (the first token comes from the prefill alone), "
                             f"got {self.sample_tokens}")
        if self.sizes is not None and (not self.sizes or min(self.sizes) < 1):
            raise EagleError(f"--sizes must be tree sizes >= 1, got {self.sizes}")


# -- prompts ----------------------------------------------------------------------------------
def load_prompts(path: str | Path | None, limit: int | None = None) -> list[str]:
    """The built-in mix (path None), or a JSONL file with one {"prompt": "..."} or {"turns": ["...", ...]}
    per line (the first turn is used; blank lines are skipped); then the first `limit`."""
    if limit is not None and limit < 1:
        raise EagleError(f"--limit must be >= 1 (certify needs at least one prompt), got {limit}")
    prompts = list(BUILTIN_PROMPTS) if path is None else _read_prompts(Path(path).expanduser())
    return prompts[:limit] if limit else prompts


def _read_prompts(path: Path) -> list[str]:
    if not path.is_file():
        raise EagleError(f"prompts file {path} not found: pass a JSONL file, one {{\"prompt\": \"...\"}} per line")
    from ..files import jsonl_objects

    prompts = [_prompt_text(obj, where) for obj, where in jsonl_objects(path)]
    if not prompts:
        raise EagleError(f"prompts file {path} holds no prompts: one {{\"prompt\": \"...\"}} per line")
    return prompts


def _prompt_text(obj, where: str) -> str:
    text = obj.get("prompt") if isinstance(obj, dict) else None
    if text is None and isinstance(obj, dict) and isinstance(obj.get("turns"), list) and obj["turns"]:
        text = obj["turns"][0]
    if not isinstance(text, str) or not text.strip():
        raise EagleError(f"{where}: expected {{\"prompt\": \"non-empty text\"}} or {{\"turns\": [\"text\", ...]}}")
    return text


# -- 1. greedy identity -----------------------------------------------------------------------
def near_tie_rule(dtype: torch.dtype, measured: float | None) -> tuple[Callable[[float], float], str]:
    """-> (threshold as a function of the top logit, the rule in words). measured: the invariance
    check's largest |logit difference|."""
    if dtype in RELATIVE_TIE:
        factor = RELATIVE_TIE[dtype]
        return (lambda top: factor * max(1.0, abs(top))), f"{factor:g} x max(1, |top logit|)"
    limit = max(measured or 0.0, HALF_FLOOR)
    said = "not measured" if measured is None else f"{measured:.3g}"
    return (lambda top: limit), (f"{limit:.3g}: the larger of the batch-invariance check's largest difference "
                                 f"({said}) and {HALF_FLOOR:g}")


def check_greedy(gen, prompts: list[list[int]], settings: CertifySettings, threshold: Callable[[float], float],
                 texts: list[str] | None = None) -> dict:
    """Greedy EAGLE (the generator's tree) against vanilla on every prompt."""
    from .device_check import find_divergence

    rows, divergences = [], []
    for k, ids in enumerate(prompts):
        vanilla = gen.generate(input_ids=ids, max_new_tokens=settings.max_new_tokens, speculative=False)
        eagle = gen.generate(input_ids=ids, max_new_tokens=settings.max_new_tokens)
        d = find_divergence(gen.target, ids, vanilla.token_ids, eagle.token_ids, threshold, k)
        rows.append({"prompt": k, "text": None if texts is None else texts[k], "prompt_tokens": len(ids),
                     "new_tokens": len(vanilla.token_ids), "identical": d is None, "tau": round(eagle.tau, 3)})
        if d is None:
            verdict = "identical"
        else:
            entry = asdict(d) | {"vanilla_text": _token_text(gen, d.vanilla_token),
                                 "eagle_text": _token_text(gen, d.eagle_token)}
            divergences.append(entry)
            verdict = f"{'near-tie' if d.near_tie else 'REAL DEFECT'} at token {d.position}"
        say(f"greedy {k + 1}/{len(prompts)}: {len(vanilla.token_ids)} tokens, tau {eagle.tau:.2f}, {verdict}")
    defects = sum(not d["near_tie"] for d in divergences)
    return {"prompts": len(prompts), "identical": len(prompts) - len(divergences), "near_ties": len(divergences) - defects,
            "defects": defects, "max_new_tokens": settings.max_new_tokens, "rows": rows, "divergences": divergences,
            "mean_tau": round(sum(r["tau"] for r in rows) / len(rows), 3), "ok": defects == 0}


def _token_text(gen, token: int | None) -> str | None:
    return None if token is None else gen.decode([token])


# -- 2. sampling ------------------------------------------------------------------------------
def two_sample_chi_square(a: Counter, b: Counter) -> tuple[float, int, int]:
    """Pearson's chi-square of homogeneity on the 2 x K table of outcome counts a, b -> (statistic,
    degrees of freedom, cells). Outcomes whose expected count is below MIN_EXPECTED in either row
    are pooled into one cell, and the next-rarest outcomes join that cell while it is still below."""
    na, nb = sum(a.values()), sum(b.values())
    n = na + nb
    per_total = min(na, nb) / n  # the smaller row's expected count per count of an outcome in both rows
    kept, pool = [], [0, 0]      # cells as [total, count in a]
    for total, in_a in sorted((a[k] + b[k], a[k]) for k in set(a) | set(b)):
        if total * per_total < MIN_EXPECTED:
            pool = [pool[0] + total, pool[1] + in_a]
        else:
            kept.append([total, in_a])
    if pool[0]:
        while pool[0] * per_total < MIN_EXPECTED and kept:
            total, in_a = kept.pop(0)
            pool = [pool[0] + total, pool[1] + in_a]
        kept.insert(0, pool)
    stat = 0.0
    for total, in_a in kept:
        ea, eb = na * total / n, nb * total / n
        stat += (in_a - ea) ** 2 / ea + (total - in_a - eb) ** 2 / eb
    return stat, len(kept) - 1, len(kept)


def chi_square_sf(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi-square(df), without scipy (not a dependency, and a verdict should not
    depend on what else is installed): exact for df 1 and 2; above, the Wilson-Hilferty normal
    approximation of (X / df)^(1/3), which overstates small p-values a little (1.37e-4 for a true
    1e-4 at df 3, 1.07e-4 at df 10), so a borderline verdict errs towards pass."""
    if df <= 0 or x <= 0:
        return 1.0
    if df == 1:
        return math.erfc(math.sqrt(x / 2))
    if df == 2:
        return math.exp(-x / 2)
    z = ((x / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


def total_variation(a: Counter, b: Counter) -> float:
    """Between the two empirical distributions: half the L1 distance (0 = the same, 1 = disjoint)."""
    na, nb = sum(a.values()), sum(b.values())
    return 0.5 * sum(abs(a[k] / na - b[k] / nb) for k in set(a) | set(b))


def draw(gen, ids: list[int], settings: CertifySettings, temperature: float, top_p: float, speculative: bool,
         seed: int, tree) -> tuple[Counter, list[int]]:
    """settings.samples draws of the first sample_tokens tokens, `batch_size` copies of the prompt
    decoded together (copy i samples with seed + i) -> (counts of tokens 2..K, the size of the tree
    verified for the second token in each draw).

    Each draw decodes one token more than it keeps: the loop verifies a row's root alone when a
    single token is left to produce, and with K + 1 every kept token comes from a drafted tree."""
    from ..core.config import SPECULATIVE

    counts, sizes = Counter(), []
    for start in range(0, settings.samples, settings.batch_size):
        copies = min(settings.batch_size, settings.samples - start)
        results = gen.generate_batch(input_ids=[ids] * copies, max_new_tokens=settings.sample_tokens + 1,
                                     temperature=temperature, top_p=top_p, seed=seed + start, tree=tree,
                                     speculative=speculative, stop_token_ids=set(),
                                     sampling_mode=SPECULATIVE)  # check 4 covers the reproducible mode
        for r in results:
            counts[tuple(r.token_ids[1:settings.sample_tokens])] += 1
            sizes.append(r.steps[0].tree_size if r.steps else 1)
    return counts, sizes


def check_sampling(gen, prompts: list[list[int]], settings: CertifySettings) -> dict:
    """For each prompt and SAMPLING_SETTINGS entry: EAGLE's and vanilla's draws, one chi-square test.

    The first token is drawn from the prefill by the target alone, by the same code in both methods:
    testing it would test nothing of EAGLE. The second is the first token verification emits (an
    accepted draft token, a recovered token from the residual after the root's children were
    rejected, or a bonus token after a depth-1 leaf), so by default it is the outcome tested (its
    distribution mixes over the first token). --sample-tokens K tests the tuple of tokens 2..K:
    more of the tree walk, in sparser cells. The draws of the two methods use disjoint seeds, so the
    two samples are independent, as the test assumes."""
    # The generator's own batch-1 tree for every batch: a tree tuned by batch size (`--tree auto`
    # with max_batch > 1) may choose no drafts for a large batch, and this check is of verification.
    tree = copy.copy(gen.tree)
    tests = []
    for k, ids in enumerate(prompts):
        for temperature, top_p in SAMPLING_SETTINGS:
            eagle, sizes = draw(gen, ids, settings, temperature, top_p, True, settings.seed, tree)
            vanilla, _ = draw(gen, ids, settings, temperature, top_p, False, settings.seed + settings.samples, tree)
            stat, df, cells = two_sample_chi_square(eagle, vanilla)
            common = sorted(set(eagle) | set(vanilla), key=lambda o: -(eagle[o] + vanilla[o]))[:3]
            tests.append({"prompt": k, "temperature": temperature, "top_p": top_p, "samples": settings.samples,
                          "outcomes": len(set(eagle) | set(vanilla)), "cells": cells, "chi2": stat, "df": df,
                          "p_value": chi_square_sf(stat, df), "tv": total_variation(eagle, vanilla),
                          "mean_tree_size": sum(sizes) / len(sizes),
                          "most_common": [{"tokens": list(o), "text": gen.decode(list(o)), "eagle": eagle[o],
                                           "vanilla": vanilla[o]} for o in common]})
            t = tests[-1]
            say(f"sampling prompt {k + 1}/{len(prompts)}, temperature {temperature:g}, top-p {top_p:g}: "
                f"chi2 {stat:.1f} (df {df}), p {t['p_value']:.3g}, TV {t['tv']:.3f}")
    cutoff = ALPHA / len(tests)
    for t in tests:
        t["ok"] = t["p_value"] >= cutoff
    return {"tests": tests, "alpha": ALPHA, "cutoff": cutoff, "sample_tokens": settings.sample_tokens,
            "failed": sum(not t["ok"] for t in tests), "ok": all(t["ok"] for t in tests)}


# -- 4. reproducible sampling -----------------------------------------------------------------
def perturbed_scores(sampling) -> Callable[[torch.Tensor, int], torch.Tensor]:
    """(logits [V], position) -> the perturbed target whose argmax reproducible sampling emits there,
    times the temperature (logit units, so that the near-tie threshold applies unchanged)."""
    from ..core.noise import gumbel, key64
    from ..core.sampling import processed_scores

    def scores(logits: torch.Tensor, position: int) -> torch.Tensor:
        s = processed_scores(logits, sampling.temperature, sampling.top_k, sampling.top_p).double()
        noise = gumbel(key64(sampling.seed), torch.tensor([position]), torch.arange(s.numel(), device=s.device))[0]
        return ((s + noise) * sampling.temperature).float()

    return scores


def check_reproducible(gen, prompts: list[list[int]], settings: CertifySettings,
                       threshold: Callable[[float], float]) -> dict:
    """For each SAMPLING_SETTINGS entry: prompt k with seed settings.seed + k, decoded by seeded
    vanilla sampling alone, by EAGLE alone and by EAGLE in one batch of every prompt (row k has seed
    + k): the three must agree token for token, up to a near-tie of the perturbed target."""
    from ..core.config import REPRODUCIBLE, SamplingParams
    from .device_check import find_divergence

    if gen.inexact_trees:
        return {"skipped": "allow_inexact: the mode cannot hold there (refused)", "rows": [], "divergences": [],
                "identical": 0, "near_ties": 0, "defects": 0, "ok": True}
    rows, divergences = [], []
    n = settings.max_new_tokens
    for temperature, top_p in SAMPLING_SETTINGS:
        kw = dict(temperature=temperature, top_p=top_p, max_new_tokens=n, stop_token_ids=set(), sampling_mode=REPRODUCIBLE)
        together = gen.generate_batch(input_ids=prompts, seed=settings.seed, **kw)
        for k, ids in enumerate(prompts):
            seed = settings.seed + k
            vanilla = gen.generate(input_ids=ids, seed=seed, speculative=False, **kw)
            alone = gen.generate(input_ids=ids, seed=seed, **kw)
            scores = perturbed_scores(SamplingParams(temperature, top_p, 0, seed, REPRODUCIBLE))
            for how, eagle in (("alone", alone), (f"in a batch of {len(prompts)}", together[k])):
                d = find_divergence(gen.target, ids, vanilla.token_ids, eagle.token_ids, threshold, k, scores)
                rows.append({"prompt": k, "temperature": temperature, "top_p": top_p, "seed": seed, "eagle": how,
                             "new_tokens": len(vanilla.token_ids), "identical": d is None, "tau": round(eagle.tau, 3)})
                if d is not None:
                    divergences.append(asdict(d) | {"temperature": temperature, "top_p": top_p, "eagle": how})
                verdict = "identical" if d is None else f"{'near-tie' if d.near_tie else 'REAL DEFECT'} at token {d.position}"
                say(f"reproducible prompt {k + 1}/{len(prompts)}, temperature {temperature:g}, top-p {top_p:g}, "
                    f"EAGLE {how}: tau {eagle.tau:.2f}, {verdict}")
    defects = sum(not d["near_tie"] for d in divergences)
    return {"rows": rows, "divergences": divergences, "identical": len(rows) - len(divergences),
            "near_ties": len(divergences) - defects, "defects": defects, "ok": defects == 0}


# -- 3. batch invariance ----------------------------------------------------------------------
def tree_nodes(gen) -> int:
    """The most tokens one verification of this generator holds (root included)."""
    drafter = gen.new_batch().drafter
    return drafter.max_nodes if drafter is not None else 1


def check_invariance(gen, settings: CertifySettings) -> dict:
    from ..engine.numerics import measure_invariance

    sizes = settings.sizes or tuple(range(1, tree_nodes(gen) + 1))
    report = measure_invariance(gen.target, sizes)
    rows = report.rows
    return report.to_dict() | {
        "rows": [row | {"exact": r.exact} for row, r in zip(report.to_dict()["rows"], rows)],
        "max_diff": max(r.max_diff for r in rows), "argmax_agrees": all(r.argmax_agrees for r in rows),
        "bitwise_sizes": [r.size for r in rows if r.bitwise], "exact_sizes": report.exact_sizes()}


# -- the certificate --------------------------------------------------------------------------
@dataclass
class Certificate:
    ok: bool
    verdict: str                # one line
    meta: dict                  # what was certified, on what
    settings: dict
    near_tie_rule: str
    greedy: dict
    sampling: dict
    invariance: dict
    seconds: dict = field(default_factory=dict)  # per check
    reproducible: dict = field(default_factory=dict)  # check 4

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, default=str) + "\n"


def certify(gen, prompts: list[list[int]], settings: CertifySettings = CertifySettings(),
            texts: list[str] | None = None) -> Certificate:
    """Run the three checks on a ready generator and encoded prompts (texts: the prompts as written,
    for the report). Invariance runs first: bf16 and fp16 take their near-tie threshold from it."""
    settings.check()
    if not prompts:
        raise EagleError("certify needs at least one prompt")
    if (gen.head is None and gen.drafter is None) or gen.tree is None:
        raise EagleError("certify compares EAGLE with vanilla decoding: give a head and a tree (not none)")
    from .device_check import spread

    seconds = {}
    start = time.perf_counter()
    invariance = check_invariance(gen, settings)
    seconds["invariance"] = time.perf_counter() - start
    say(f"batch invariance: sizes {invariance['rows'][0]['size']}-{invariance['rows'][-1]['size']}, "
        f"max diff {invariance['max_diff']:.3g}, bitwise at {_ranges(invariance['bitwise_sizes'])}")
    threshold, rule = near_tie_rule(gen.target.dtype, invariance["max_diff"])
    start = time.perf_counter()
    greedy = check_greedy(gen, prompts, settings, threshold, texts)
    seconds["greedy"] = time.perf_counter() - start
    start = time.perf_counter()
    sampling = check_sampling(gen, spread(prompts, settings.sample_prompts), settings)
    seconds["sampling"] = time.perf_counter() - start
    start = time.perf_counter()
    reproducible = check_reproducible(gen, spread(prompts, settings.sample_prompts), settings, threshold)
    seconds["reproducible"] = time.perf_counter() - start
    ok = greedy["ok"] and sampling["ok"] and reproducible["ok"]
    problems = ([f"{greedy['defects']} real greedy defect(s)"] if greedy["defects"] else []) + (
        [f"{sampling['failed']} sampling test(s) failed"] if sampling["failed"] else []) + (
        [f"{reproducible['defects']} real reproducible-sampling defect(s)"] if reproducible["defects"] else [])
    ties = greedy["near_ties"] + reproducible["near_ties"]
    verdict = ("lossless on every check" + (f" ({ties} floating-point near-tie(s), not defects)"
                                            if ties else "")) if ok else "; ".join(problems)
    return Certificate(ok, verdict, describe(gen), asdict(settings), rule, greedy, sampling, invariance, seconds,
                       reproducible)


def describe(gen) -> dict:
    """What was certified, and on what (measured facts carry their machine)."""
    from .. import __version__
    from ..core.tree import StaticTree
    from ..engine.target import cpu_identity

    tree = gen.tree
    if isinstance(tree, StaticTree):
        grown = gen.rerank_for(tree)
        tree = (f"{'auto: ' if gen.tuned is not None else ''}static, {tree.num_nodes - 1} draft nodes, depth {tree.depth}"
                + (f" (a lone sequence grows it as dynamic:{grown},{tree.depth},{tree.num_nodes - 1})" if grown else ""))
    if gen.drafter is not None:  # a ready drafter grows its own trees
        head, tree = f"drafter {type(gen.drafter).__name__}", "the drafter's own"
    else:
        head = (f"{gen.head.kind} {gen.head_dir if gen.head_dir is not None else '(in-process, no directory)'} "
                f"in {str(gen.draft_dtype).removeprefix('torch.')}")  # --draft-dtype
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "target": gen.target.name, "head": head, "tree": str(tree),
            "tree_nodes": tree_nodes(gen), "dtype": str(gen.target.dtype).removeprefix("torch."),
            "quantization": gen.target.quantization or "none", "numerics": gen.numerics_note, "head_note": gen.head_note,
            "device": str(gen.target.device), "steps": gen.target.steps.name, "threads": torch.get_num_threads(), **cpu_identity(),
            "versions": {"eaglespec": __version__, "torch": torch.__version__}}


# -- the report -------------------------------------------------------------------------------
def markdown(cert: Certificate) -> str:
    """The one-page report (printed as is, and saved as certificate.md)."""
    m, g, s, inv, rep = cert.meta, cert.greedy, cert.sampling, cert.invariance, cert.reproducible
    bitwise = inv["bitwise_sizes"]
    lines = [f"# eaglespec certify: {'PASS' if cert.ok else 'FAIL'}", "",
             f"target {m['target']} ({m['dtype']}{_quantized(m['quantization'])}, {m['device']}, "
             f"{m.get('steps', 'eager')} decoding step), head {m['head']}, "
             f"tree {m['tree']} "
             f"({m['tree_nodes']} tokens per verification); {m['cpu']}, {m['threads']} thread(s), "
             f"torch {m['versions']['torch']}, {m['date']}", "",
             *_table(("check", "verdict", "result", "seconds"), [
                 ("1. greedy identity", _pass(g["ok"]),
                  f"{g['identical']}/{g['prompts']} identical, {g['near_ties']} near-tie(s), {g['defects']} real "
                  f"defect(s); {g['max_new_tokens']} new tokens, mean tau {g['mean_tau']}", _secs(cert, "greedy")),
                 ("2. sampling", _pass(s["ok"]),
                  f"{len(s['tests'])} test(s), {s['failed']} failed; smallest p "
                  f"{min(t['p_value'] for t in s['tests']):.3g} (fails below {s['cutoff']:.3g}){_few(cert)}",
                  _secs(cert, "sampling")),
                 ("3. batch invariance", "info",
                  f"{inv['dtype']}: bitwise at sizes {_ranges(bitwise) or 'none'} of "
                  f"{_ranges([r['size'] for r in inv['rows']])}; max diff {inv['max_diff']:.3g}; argmax "
                  f"{'agrees at every size' if inv['argmax_agrees'] else 'DIFFERS at some size'}",
                  _secs(cert, "invariance")),
                 *([("4. reproducible sampling", _pass(rep["ok"]),
                     rep.get("skipped") or f"{rep['identical']}/{len(rep['rows'])} identical to seeded vanilla, "
                     f"{rep['near_ties']} near-tie(s), {rep['defects']} real defect(s)", _secs(cert, "reproducible"))]
                   if rep else [])]),
             "", f"**Verdict: {'PASS' if cert.ok else 'FAIL'}**: {cert.verdict}.", "",
             "## 1. Greedy identity", "",
             f"EAGLE against vanilla greedy decoding, token for token. A divergence is a floating-point near-tie when "
             f"the logits of both tokens, from a plain forward of the target on prompt + common prefix, lie within "
             f"the threshold of the top logit; the threshold is {cert.near_tie_rule}. Near-ties pass; any other "
             f"divergence is a real defect and fails."]
    if g["divergences"]:
        lines += ["", *_table(("prompt", "token", "vanilla", "EAGLE", "top-2 gap", "token gap", "threshold", "verdict"), [
            (d["prompt"], d["position"], _tok(d["vanilla_token"], d["vanilla_text"]), _tok(d["eagle_token"], d["eagle_text"]),
             _num(d["top2_gap"]), _num(d["token_gap"]), _num(d["threshold"]), "near-tie" if d["near_tie"] else "REAL DEFECT")
            for d in g["divergences"]])]
    lines += ["", "## 2. Sampling", "",
              f"Per prompt and setting, {s['tests'][0]['samples']} draws with EAGLE and as many with vanilla decoding "
              f"(disjoint seeds); the outcome is {_outcome(s['sample_tokens'])}. Two-sample chi-square test of "
              f"homogeneity (outcomes expected fewer than {MIN_EXPECTED:g} times pooled); TV is the total variation "
              f"distance between the two samples. Rule: a test fails when p < {ALPHA:g} / {len(s['tests'])} "
              f"= {s['cutoff']:.3g} (Bonferroni over the tests run); the check fails when any test does.", "",
              *_table(("prompt", "temperature", "top-p", "outcomes", "cells", "chi2", "df", "p", "TV", "tree size", "verdict"), [
                  (t["prompt"], f"{t['temperature']:g}", f"{t['top_p']:g}", t["outcomes"], t["cells"], f"{t['chi2']:.1f}",
                   t["df"], f"{t['p_value']:.3g}", f"{t['tv']:.3f}", f"{t['mean_tree_size']:.1f}", _pass(t["ok"]))
                  for t in s["tests"]])]
    if rep and rep["rows"]:
        lines += ["", "## 4. Reproducible sampling", "",
                  "`--sampling-mode reproducible`: seeded vanilla sampling against EAGLE alone and EAGLE in one batch of "
                  "every sampling prompt (prompt k with seed + k), token for token. A divergence is judged as in check 1, "
                  "on the perturbed target (logits + temperature x the keyed Gumbel noise).", "",
                  *_table(("prompt", "temperature", "top-p", "seed", "EAGLE", "tokens", "tau", "verdict"), [
                      (r["prompt"], f"{r['temperature']:g}", f"{r['top_p']:g}", r["seed"], r["eagle"], r["new_tokens"],
                       r["tau"], "identical" if r["identical"] else next(
                           ("near-tie" if d["near_tie"] else "REAL DEFECT") for d in rep["divergences"]
                           if (d["prompt"], d["temperature"], d["top_p"], d["eagle"]) ==
                           (r["prompt"], r["temperature"], r["top_p"], r["eagle"])))
                      for r in rep["rows"]])]
    lines += ["", "## 3. Batch invariance", "",
              f"Per-row logits of a q-token forward against the same tokens one at a time (numerics.measure_invariance, "
              f"{inv['dtype']}), for the tree sizes this generator may verify. Where a size is not bitwise equal, greedy "
              f"EAGLE may differ from vanilla at a near-tie. Exact: bitwise, or within fp32 summation order (the sizes "
              f"`--tree auto` uses without `--allow-inexact`).", ""]
    runs: list[tuple[list[int], tuple]] = []  # consecutive sizes with the same measurement share a row
    for r in inv["rows"]:
        same = (r["max_diff"], r["argmax_agrees"], r["bitwise"], r["exact"])
        if runs and runs[-1][1] == same and runs[-1][0][-1] == r["size"] - 1:
            runs[-1][0].append(r["size"])
        else:
            runs.append(([r["size"]], same))
    lines += _table(("size", "max diff", "argmax agrees", "bitwise", "exact"),
                    [(_ranges(sizes), f"{diff:.3g}", _yes(agrees, "NO"), _yes(bitwise), _yes(exact))
                     for sizes, (diff, agrees, bitwise, exact) in runs])
    return "\n".join(lines) + "\n"


def _table(header: tuple[str, ...], rows) -> list[str]:
    """A markdown table's lines: the header, its rule, a line per row of already formatted cells."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(str(cell) for cell in row) + " |" for row in rows)]


def write(cert: Certificate, out: Path) -> tuple[Path, Path]:
    """certificate.json and certificate.md in `out`, each replaced atomically."""
    out.mkdir(parents=True, exist_ok=True)
    paths = out / "certificate.json", out / "certificate.md"
    atomic_write_bytes(paths[0], cert.to_json().encode())
    atomic_write_bytes(paths[1], markdown(cert).encode())
    return paths


def _quantized(method: str) -> str:
    return "" if method == "none" else f", {method} weight-only"


def _outcome(k: int) -> str:
    return "the second token (the first one verification emits)" if k == 2 else f"the tuple of tokens 2..{k}"


def _few(cert: Certificate) -> str:
    n = cert.settings["samples"]
    if n >= CERTIFICATE_SAMPLES:
        return ""
    return f"; only {n} draws per test: a smoke test (a certificate draws {CERTIFICATE_SAMPLES})"


def _yes(flag: bool, no: str = "no") -> str:
    return "yes" if flag else no


def _secs(cert: Certificate, check: str) -> str:
    return f"{cert.seconds[check]:.0f}" if check in cert.seconds else "-"


def _pass(ok: bool) -> str:
    return "pass" if ok else "FAIL"


def _tok(token: int | None, text: str | None) -> str:
    if token is None:
        return "(end)"
    return f"{token} {json.dumps(text)}".replace("|", "\\|") if text is not None else str(token)


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _ranges(sizes: list[int]) -> str:
    """[1, 2, 3, 5] -> '1-3, 5'."""
    runs: list[list[int]] = []
    for n in sorted(sizes):
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def say(message: str) -> None:
    print(f"{SAY_PREFIX} {message}", file=sys.stderr, flush=True)


# -- command line -----------------------------------------------------------------------------
def register(sub) -> None:
    from ..cli.options import add_model_args

    d = CertifySettings()
    p = sub.add_parser("certify", help="check that EAGLE is lossless for a target, head, dtype and tree on this "
                                       "machine (greedy identity, sampling test, batch invariance); exit 1 on a defect")
    add_model_args(p)
    p.add_argument("--prompts", default=None, help="JSONL file, one {\"prompt\": ...} or {\"turns\": [...]} per line "
                   f"(default: {len(BUILTIN_PROMPTS)} built-in prompts: chat, code, math, translation, QA, ...)")
    p.add_argument("--limit", type=int, default=None, help="use the first N prompts")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help="greedy check: new tokens per prompt")
    p.add_argument("--samples", type=int, default=d.samples,
                   help="sampling check: draws per method, prompt and setting (at least 1,000 for a certificate)")
    p.add_argument("--sample-prompts", type=int, default=d.sample_prompts, help="sampling check: prompts")
    p.add_argument("--sample-tokens", type=int, default=d.sample_tokens,
                   help="sampling check: tokens per draw; the outcome tested is tokens 2..K (default 2: the second token)")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="sampling check: draws decoded together")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--sizes", default=None, help="batch-invariance sizes, e.g. 1,2,4,8 (default: 1..the tree's nodes)")
    p.add_argument("--out", type=Path, default=None, help="where certificate.json and .md go (default runs/certify-<time>)")
    p.set_defaults(func=cmd_certify)


def settings_from(args) -> CertifySettings:
    sizes = None
    if args.sizes is not None:
        try:
            sizes = tuple(int(s) for s in args.sizes.split(","))
        except ValueError:
            raise EagleError(f"--sizes {args.sizes!r}: give tree sizes such as 1,2,4,8") from None
    settings = CertifySettings(args.max_new_tokens, args.sample_prompts, args.samples, args.sample_tokens,
                               args.batch_size, args.seed, sizes)
    settings.check()
    return settings


def cmd_certify(args) -> int:
    from ..cli.options import load_generator

    settings = settings_from(args)
    texts = load_prompts(args.prompts, args.limit)  # bad input fails before the model loads
    if args.head == "none":
        raise EagleError("certify compares EAGLE with vanilla decoding: --head none has nothing to certify")
    if args.tree == "none":
        raise EagleError("certify compares EAGLE with vanilla decoding: --tree none has nothing to certify")
    out = output_folder(args.out or Path("runs") / f"certify-{time.strftime('%Y%m%d-%H%M%S')}")  # before the work
    gen = load_generator(args)  # checks the model options before loading
    if gen.target.tokenizer is None:
        raise EagleError(f"target {gen.target.name} has no tokenizer: certify encodes text prompts")
    say(f"{len(texts)} prompt(s) ({'built-in' if args.prompts is None else args.prompts}), {settings.samples} draws per "
        f"sampling test; report in {out}")
    cert = certify(gen, [gen.encode(t) for t in texts], settings, texts)
    print(markdown(cert), end="", flush=True)
    json_path, md_path = write(cert, out)
    say(f"wrote {json_path} and {md_path}")
    return 0 if cert.ok else 1
