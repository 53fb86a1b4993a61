"""The data-scaling study (`python -m eaglespec.train.scaling`): EAGLE-1 heads trained with one
recipe on growing prefixes of one capture, each measured as soon as it is trained.

For each point (training conversations K) it waits until the capture holds `eval_first + K`
conversations (the capture grows in the background), trains `runs/scaling/eagle1-K` on the
capture's examples eval_first .. eval_first + K (`--eval-first`: one held-out set, the first
`eval_first`, for every point), then measures tau and n-alpha with EAGLE-1's tree on each prompt
set (`bench.acceptance`, every output checked against vanilla). The results land in one JSON file
(default docs/data/scaling.json) after every measurement, and the plot beside it is redrawn, so
that a lost machine loses at most the point in progress. Every step resumes: training from its
checkpoint, a measured set is not measured again.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ..draft.contract import WEIGHTS
from ..errors import EagleError
from ..files import atomic_write_bytes, jsonl_objects
from ..pause import wait_if_paused
from .capture import read_manifest
from .trainer import CHECKPOINT, METRICS

POINTS = (1536, 3072, 6144, 12288, 0)  # 0: all the capture holds, once it is complete
# The shipped head's recipe (docs/training.md), the same at every point.
RECIPE = ("--epochs", "5", "--lr", "6e-4", "--grad-accum", "4", "--warmup", "40", "--loss-vocab", "8192",
          "--checkpoint-every", "100")
# (name, bench dataset, prompt limit): MT-bench tunes the study; HumanEval and our task set check it
SETS = (("mt-bench", "mt-bench", None), ("humaneval-40", "humaneval", 40), ("tasks", "tasks", None))
TREE = "eagle1"


def _wait_for_data(capture: Path, needed: int | None, poll_s: float) -> int:
    """Block until the capture has `needed` examples (None: until it is complete); -> examples."""
    told = None
    while True:
        m = read_manifest(capture)
        if (m["complete"] if needed is None else m["examples"] >= needed):
            return m["examples"]
        if told != m["examples"]:
            want = "to complete" if needed is None else f"to reach {needed}"
            print(f"[scaling] waiting for the capture {want} ({m['examples']} conversations so far)", flush=True)
            told = m["examples"]
        time.sleep(poll_s)


def _load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {"points": {}}


def _save(path: Path, results: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, (json.dumps(results, indent=1) + "\n").encode())
    plot(results, path.with_suffix(".png"))


def _held_out(head: Path) -> dict | None:
    """The last held-out evaluation of a trained head: loss and accuracy at depths 1-4."""
    metrics = head / METRICS
    if not metrics.is_file():
        return None
    evals = [row for row, _ in jsonl_objects(metrics) if row.get("kind") == "eval"]
    return evals[-1] if evals else None


def run(capture: Path, out: Path, results_path: Path, eval_first: int, points, time_limit: float | None,
        poll_s: float = 60.0, train_main=None, acceptance_main=None) -> dict:
    from ..bench import acceptance
    from . import cli as train_cli

    train_main = train_main or train_cli.main
    acceptance_main = acceptance_main or acceptance.main
    results = _load(results_path)
    results.setdefault("meta", {}).update({"capture": capture.name, "eval_first": eval_first, "recipe": list(RECIPE),
                                          "tree": TREE, "sets": [name for name, *_ in SETS]})
    for k in points:
        examples = _wait_for_data(capture, None if k == 0 else eval_first + k, poll_s)
        k = k or examples - eval_first
        name = f"eagle1-{k}"
        point = results["points"].setdefault(name, {"train_examples": k})
        head = out / name
        finished = (head / WEIGHTS).is_file() and not (head / CHECKPOINT).exists()  # trained, not yet saved here
        if "held_out" not in point and not finished:
            wait_if_paused(head, print)
            argv = ["train", "--capture-dir", str(capture), "--partial", "--out", str(head),
                    "--eval-first", str(eval_first), "--train-examples", str(k), *RECIPE]
            if time_limit is not None:
                argv += ["--time-limit", str(time_limit)]
            print(f"[scaling] training {name}: eaglespec {' '.join(argv[1:])}", flush=True)
            try:
                code = train_main(argv)
            except SystemExit as exc:  # the train command's own one-line error, already printed
                code = exc.code
            if code != 0:
                raise EagleError(f"training {name} failed (exit {code}); rerun to resume it")
            if (head / CHECKPOINT).exists():  # stopped by --time-limit: continue in the next run
                print(f"[scaling] {name} stopped at its time limit; rerun to continue", flush=True)
                return results
        if "held_out" not in point:
            point["held_out"] = _held_out(head)
            _save(results_path, results)
        for set_name, dataset, limit in SETS:
            if set_name in point:
                continue
            where = out / f"{name}-{set_name}"
            argv = ["--head", str(head), "--trees", TREE, "--dataset", dataset, "--out", str(where)]
            if limit:
                argv += ["--limit", str(limit)]
            print(f"[scaling] measuring {name} on {set_name}", flush=True)
            acceptance_main(argv)
            row = json.loads((where / "results.json").read_text())["rows"][0]
            if row["identical"] != row["prompts"]:
                raise EagleError(f"{name} on {set_name}: an EAGLE output differs from vanilla's ({where})")
            point[set_name] = {"tau": row["tau"], "n_alpha": row["n_alpha"], "prompts": row["prompts"]}
            _save(results_path, results)
    return results


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = sorted(results["points"].values(), key=lambda p: p["train_examples"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for set_name, *_ in SETS:
        xs = [p["train_examples"] for p in points if set_name in p]
        left.plot(xs, [p[set_name]["tau"] for p in points if set_name in p], "o-", label=set_name)
        right.plot(xs, [p[set_name]["n_alpha"][0] for p in points if set_name in p], "o-", label=set_name)
    xs = [p["train_examples"] for p in points if p.get("held_out")]
    right.plot(xs, [p["held_out"]["acc_depth1"] for p in points if p.get("held_out")], "s--", color="gray",
               label="held-out ShareGPT (teacher-forced)")
    for ax, label in ((left, f"tau ({TREE} tree, greedy, 256 tokens)"), (right, "depth-1 acceptance")):
        ax.set_xscale("log")
        ax.set_xlabel("training conversations")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("EAGLE-1 heads for SmolLM2-135M-Instruct: one recipe, growing ShareGPT prefixes")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m eaglespec.train.scaling", description=__doc__.split("\n\n")[0])
    p.add_argument("--capture-dir", type=Path, default=Path("runs/capture-full"))
    p.add_argument("--out", type=Path, default=Path("runs/scaling"), help="the heads and their measurements")
    p.add_argument("--results", type=Path, default=Path("docs/data/scaling.json"),
                   help="the results file (the plot is written beside it, .png)")
    p.add_argument("--eval-first", type=int, default=128, help="held-out conversations: the capture's first N")
    p.add_argument("--points", default=",".join(map(str, POINTS)),
                   help="training conversations per point, 0 = all (default %(default)s)")
    p.add_argument("--time-limit", type=float, default=None, help="minutes of training per run (then rerun)")
    p.add_argument("--poll", type=float, default=60.0, help="seconds between looks at a growing capture")
    args = p.parse_args(argv)
    try:
        points = [int(x) for x in args.points.split(",") if x.strip()]
        run(args.capture_dir, args.out, args.results, args.eval_first, points, args.time_limit, args.poll)
    except (EagleError, ValueError) as exc:
        print(f"{p.prog}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
