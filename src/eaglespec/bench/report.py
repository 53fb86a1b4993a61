"""Bench outputs: results.json (every record plus metadata), results.md (tables) and PNG plots.
Every file is written to a temporary name beside it and renamed, so a reader never sees half a file."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from ..files import atomic_path
from .harness import BenchResult
from .methods import BASELINE
from .metrics import tokens_per_second

PLOTS = ("speedup_by_category.png", "tau.png", "acceptance_by_depth.png")


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    with atomic_path(path) as tmp:
        write(Path(tmp))


def to_json(result: BenchResult, summary: dict, meta: dict) -> dict:
    records = []
    for e in result.entries:
        r = e.record
        records.append({
            "question_id": e.question_id, "category": e.category, "turn": e.turn, "method": e.method,
            "order": e.order, "prompt_tokens": e.prompt_tokens, "new_tokens": len(r.token_ids),
            "elapsed": r.elapsed, "tokens_per_s": tokens_per_second(len(r.token_ids), r.elapsed),
            "matches_vanilla": e.matches_vanilla, **{k: v for k, v in asdict(r).items() if k != "elapsed"},
        })
    return {"meta": meta, "lossless": result.lossless, "failures": result.failures, "warnings": result.warnings,
            "summary": summary, "records": records}


def _fmt(x, spec: str = ".2f", suffix: str = "") -> str:
    return "–" if x is None else f"{x:{spec}}{suffix}"


def _agreement(result: BenchResult, method: str) -> str:
    flags = [e.matches_vanilla for e in result.entries if e.method == method]
    if method == BASELINE:
        return "baseline"
    if any(f is None for f in flags):
        return "– (sampling)"
    bad = flags.count(False)
    return "identical" if not bad else f"**{bad}/{len(flags)} differ**"


def markdown(result: BenchResult, summary: dict, meta: dict) -> str:
    lines = [
        f"# eaglespec bench: {meta.get('dataset')}", "",
        f"- command: `{meta.get('command')}`",
        f"- model: {meta.get('model')}; head: {meta.get('head')}",
        f"- device: {meta.get('device')} ({meta.get('device_name')}); dtype: {meta.get('dtype')}; threads: {meta.get('threads')}",
        f"- date: {meta.get('date')}; prompts: {meta.get('prompts')}; max new tokens: {meta.get('max_new_tokens')}; "
        f"temperature: {meta.get('temperature')}",
        "",
        "| method | tokens | time (s) | tokens/s | speedup | tau | output vs vanilla |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for m, s in summary.items():
        lines.append(f"| {m} | {s['tokens']} | {s['seconds']:.2f} | {s['tokens_per_s']:.1f} | "
                     f"{_fmt(s['speedup'], '.2f', 'x')} | {_fmt(s['tau'])} | {_agreement(result, m)} |")
    alphas = {m: s["n_alpha"] for m, s in summary.items() if s["n_alpha"]}
    if alphas:
        depth = max(len(a) for a in alphas.values())
        lines += ["", "Acceptance rate at depth n (n-alpha):", "",
                  "| method | " + " | ".join(f"{n}-alpha" for n in range(1, depth + 1)) + " |",
                  "|---|" + "---:|" * depth]
        for m, a in alphas.items():
            lines.append(f"| {m} | " + " | ".join(_fmt(a[i]) if i < len(a) else "" for i in range(depth)) + " |")
    hists = {m: s["histogram"] for m, s in summary.items() if s["histogram"] and m != BASELINE}
    if hists:
        width = max(len(h) for h in hists.values())
        lines += ["", "Acceptance histogram (verification steps that accepted k draft tokens):", "",
                  "| method | " + " | ".join(f"k={k}" for k in range(width)) + " |", "|---|" + "---:|" * width]
        for m, h in hists.items():
            lines.append(f"| {m} | " + " | ".join(str(h[k]) if k < len(h) else "0" for k in range(width)) + " |")
    categories = list(dict.fromkeys(c for s in summary.values() for c in s["speedup_by_category"]))
    others = [m for m in summary if m != BASELINE]
    if len(categories) > 1 and others:
        lines += ["", "Speedup over vanilla per category:", "", "| category | " + " | ".join(others) + " |",
                  "|---|" + "---:|" * len(others)]
        for c in categories:
            lines.append(f"| {c} | " + " | ".join(_fmt(summary[m]["speedup_by_category"].get(c), ".2f", "x") for m in others) + " |")
    if result.failures:
        lines += ["", "## LOSSLESSNESS FAILURES", ""] + [f"- {f}" for f in result.failures]
    if result.warnings:
        lines += ["", "## Warnings (outside references)", ""] + [f"- {w}" for w in result.warnings]
    return "\n".join(lines) + "\n"


def plot(summary: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    others = [m for m in summary if m != BASELINE]

    def save(fig, name: str) -> None:
        path = out / name
        write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight"))
        plt.close(fig)
        paths.append(path)

    categories = list(dict.fromkeys(c for s in summary.values() for c in s["speedup_by_category"]))
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(categories) * max(1, len(others)) / 2), 4))
    width = 0.8 / max(1, len(others))
    for i, m in enumerate(others):
        values = [summary[m]["speedup_by_category"].get(c) or 0.0 for c in categories]
        ax.bar([j + i * width for j in range(len(categories))], values, width, label=m)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(categories))], categories, rotation=30, ha="right")
    ax.set_ylabel("speedup over vanilla")
    ax.set_title("Speedup per category")
    if others:
        ax.legend(fontsize=8)
    save(fig, PLOTS[0])

    with_tau = [m for m in summary if summary[m]["tau"] is not None]
    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(with_tau)), 4))
    ax.bar(with_tau, [summary[m]["tau"] for m in with_tau], color="tab:blue")
    ax.set_ylabel("tau (tokens per target forward)")
    ax.set_title("Mean accepted length tau")
    ax.tick_params(axis="x", rotation=30)
    save(fig, PLOTS[1])

    fig, ax = plt.subplots(figsize=(6, 4))
    for m in others:
        alpha = summary[m]["n_alpha"]
        if alpha:
            ns = [n for n, a in enumerate(alpha, 1) if a is not None]
            ax.plot(ns, [a for a in alpha if a is not None], marker="o", label=m)
    ax.set_xlabel("depth n")
    ax.set_ylabel("n-alpha")
    ax.set_ylim(0, 1.05)
    ax.set_title("Acceptance rate by depth")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    save(fig, PLOTS[2])
    return paths


def _dumps(data: dict) -> str:
    """Indented JSON, except one line per record (a record's token lists would fill a screen each)."""
    head = json.dumps({k: v for k, v in data.items() if k != "records"}, indent=1)
    records = ",\n".join("  " + json.dumps(r) for r in data["records"])
    return head[:-2] + ',\n "records": [\n' + records + "\n ]\n}\n"


def write_outputs(out: Path, result: BenchResult, summary: dict, meta: dict, plots: bool = True) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    data = to_json(result, summary, meta)
    json_path, md_path = out / "results.json", out / "results.md"
    write_atomic(json_path, lambda tmp: tmp.write_text(_dumps(data), encoding="utf-8"))
    write_atomic(md_path, lambda tmp: tmp.write_text(markdown(result, summary, meta), encoding="utf-8"))
    return [json_path, md_path] + (plot(summary, out) if plots else [])
