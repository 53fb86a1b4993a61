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

`--levers` trains variants of the recipe at one point (`--lever-point`, on the same split), one
change each, of one option or a few (LEVERS: epochs, peak learning rate, warm-up, the token
loss's vocabulary and weight, noise, continued training, decoder layers), and measures each on the held-out split and MT-bench, into the same file under "levers".
`--eagle3 K` trains the EAGLE-3 head of point K (training-time test, EAGLE3_RECIPE) from the same
capture, which must hold the fused layers (`capture --aux-layers auto`), measured like a point.
Acceptance is measured on the eager kernels (`--compile off`): tau does not depend on them, and
batched compiled graphs would cost minutes each to build.
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
# One change each (of one option or a few), at one point, measured on the same held-out split and on MT-bench.
LEVERS = {
    "epochs-10": ("--epochs", "10"),
    "lr-3e-4": ("--lr", "3e-4"),
    "lr-1.2e-3": ("--lr", "1.2e-3"),
    "warmup-200": ("--warmup", "200"),
    "noise-0": ("--noise", "0"),
    "noise-0.2": ("--noise", "0.2"),
    "loss-vocab-full": ("--loss-vocab", "49152"),  # every token of SmolLM2's vocabulary: the paper's loss
    # The token loss's weight (the paper's 0.1): drafts are scored by top-1 agreement, which the token loss
    # trains directly; the feature loss keeps the features the head feeds itself at deeper levels.
    "token-weight-0.5": ("--token-loss-weight", "0.5"),
    "token-weight-1": ("--token-loss-weight", "1"),
    # Continued training: five more epochs of the recipe from the shipped 16k head, ten in all at half
    # epochs-10's cost. Meant for the all point (--lever-point 15970), the split that head was trained
    # on (--eval-first 128 held out); at another point its held-out figures would not be held out.
    "from-16k": ("--init-from", "smollm2-135m-instruct-16k"),
    # Capacity: a head of two decoder layers (the paper's has one), from a fresh initialisation.
    "layers-2": ("--head-layers", "2"),
    # Both: the shipped 16k head grown to two layers (the new one starts as the identity) and trained two
    # more epochs, for the all point (--lever-point 15970) like from-16k. Three options: one lever.
    "grow-16k-2": ("--init-from", "smollm2-135m-instruct-16k", "--head-layers", "2", "--epochs", "2"),
}
# EAGLE-3 (training-time test of 7 steps): the ablation's recipe (docs/training.md), the same 5 epochs.
EAGLE3_RECIPE = ("--head", "eagle3", "--epochs", "5", "--lr", "1e-3", "--grad-accum", "4", "--warmup", "20",
                 "--checkpoint-every", "25")


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


def _recipe(base: tuple[str, ...], changes: tuple[str, ...]) -> list[str]:
    """base with the options in changes (flag, value pairs) replaced or added."""
    argv = list(base)
    for flag, value in zip(changes[::2], changes[1::2]):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    return argv


def _train_and_measure(point: dict, save, capture: Path, head: Path, eval_first: int, k: int, recipe: list[str],
                       sets, time_limit: float | None, train_main, acceptance_main) -> bool:
    """Train `head` on examples eval_first .. eval_first + k with `recipe` (resuming), record its
    held-out evaluation, then measure it on `sets`, saving after every step. -> False when
    training stopped at its time limit (rerun to continue)."""
    name = head.name
    finished = (head / WEIGHTS).is_file() and not (head / CHECKPOINT).exists()  # trained, not yet saved here
    if "held_out" not in point and not finished:
        wait_if_paused(head, print)
        argv = ["train", "--capture-dir", str(capture), "--partial", "--out", str(head),
                "--eval-first", str(eval_first), "--train-examples", str(k), *recipe]
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
            return False
    if "held_out" not in point:
        point["held_out"] = _held_out(head)
        save()
    _measure(point, save, str(head), head.parent / f"{name}-measured", sets, acceptance_main)
    return True


def _measure(point: dict, save, head: str, where: Path, sets, acceptance_main) -> None:
    """`head` (a folder or a shipped head's name) on each of `sets` not yet in `point`, saving after each."""
    for set_name, dataset, limit in sets:
        if set_name in point:
            continue
        argv = ["--head", head, "--trees", TREE, "--dataset", dataset, "--out", str(where / set_name),
                "--compile", "off"]
        if limit:
            argv += ["--limit", str(limit)]
        print(f"[scaling] measuring {head} on {set_name}", flush=True)
        acceptance_main(argv)
        row = json.loads((where / set_name / "results.json").read_text())["rows"][0]
        if row["identical"] != row["prompts"]:
            raise EagleError(f"{head} on {set_name}: an EAGLE output differs from vanilla's ({where / set_name})")
        point[set_name] = {"tau": row["tau"], "n_alpha": row["n_alpha"], "prompts": row["prompts"]}
        save()


def run(capture: Path, out: Path, results_path: Path, eval_first: int, points, time_limit: float | None,
        poll_s: float = 60.0, train_main=None, acceptance_main=None, levers=(), lever_point: int = 1536,
        eagle3: int | None = None, baseline: str | None = None) -> dict:
    from ..bench import acceptance
    from . import cli as train_cli

    train_main = train_main or train_cli.main
    acceptance_main = acceptance_main or acceptance.main
    results = _load(results_path)
    results.setdefault("meta", {}).update({"capture": capture.name, "eval_first": eval_first, "recipe": list(RECIPE),
                                          "tree": TREE, "sets": [name for name, *_ in SETS]})
    save = lambda: _save(results_path, results)  # noqa: E731
    common = dict(time_limit=time_limit, train_main=train_main, acceptance_main=acceptance_main)
    if baseline:  # the head to beat, on the same sets (the ship rule: MT-bench and the second set)
        _measure(results.setdefault("baseline", {}).setdefault(baseline, {}), save, baseline,
                 out / f"baseline-{Path(baseline).name}", SETS, acceptance_main)
    for k in points:
        examples = _wait_for_data(capture, None if k == 0 else eval_first + k, poll_s)
        k = k or examples - eval_first
        point = results["points"].setdefault(f"eagle1-{k}", {"train_examples": k})
        if not _train_and_measure(point, save, capture, out / f"eagle1-{k}", eval_first, k, list(RECIPE), SETS,
                                  **common):
            return results
    if levers:
        _wait_for_data(capture, eval_first + lever_point, poll_s)
        results["meta"]["lever_point"] = lever_point
        for name in levers:  # keyed by point and name: levers at another point are other heads
            key = f"eagle1-{lever_point}-{name}"
            lever = results.setdefault("levers", {}).setdefault(key, {"lever": name, "train_examples": lever_point,
                                                                      "changes": list(LEVERS[name])})
            if not _train_and_measure(lever, save, capture, out / key, eval_first, lever_point,
                                      _recipe(RECIPE, LEVERS[name]), SETS[:1], **common):
                return results
    if eagle3 is not None:
        examples = _wait_for_data(capture, None if eagle3 == 0 else eval_first + eagle3, poll_s)
        k = eagle3 or examples - eval_first
        results["meta"]["eagle3_recipe"] = list(EAGLE3_RECIPE)
        point = results.setdefault("eagle3", {}).setdefault(f"eagle3-{k}", {"train_examples": k})
        if not _train_and_measure(point, save, capture, out / f"eagle3-{k}", eval_first, k, list(EAGLE3_RECIPE),
                                  SETS, **common):
            return results
    return results


def plot(results: dict, path: Path) -> None:
    """tau and depth-1 acceptance against training conversations (log x), EAGLE-3 points as stars;
    with levers, a third panel: each lever's MT-bench tau and held-out depth-1 accuracy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = sorted(results["points"].values(), key=lambda p: p["train_examples"])
    eagle3 = sorted(results.get("eagle3", {}).values(), key=lambda p: p["train_examples"])
    at = results.get("meta", {}).get("lever_point")
    levers = {lever["lever"]: lever for lever in results.get("levers", {}).values()
              if "mt-bench" in lever and lever.get("held_out") and lever["train_examples"] == at}
    fig, axes = plt.subplots(1, 3 if levers else 2, figsize=(15 if levers else 10, 4))
    left, right = axes[0], axes[1]
    for set_name, *_ in SETS:
        xs = [p["train_examples"] for p in points if set_name in p]
        line, = left.plot(xs, [p[set_name]["tau"] for p in points if set_name in p], "o-", label=set_name)
        right.plot(xs, [p[set_name]["n_alpha"][0] for p in points if set_name in p], "o-", label=set_name)
        done = [p for p in eagle3 if set_name in p]
        if done:
            x3 = [p["train_examples"] for p in done]
            left.plot(x3, [p[set_name]["tau"] for p in done], "*", ms=12, color=line.get_color(),
                      label=f"{set_name}, EAGLE-3")
            right.plot(x3, [p[set_name]["n_alpha"][0] for p in done], "*", ms=12, color=line.get_color())
    xs = [p["train_examples"] for p in points if p.get("held_out")]
    right.plot(xs, [p["held_out"]["acc_depth1"] for p in points if p.get("held_out")], "s--", color="gray",
               label="held-out ShareGPT (teacher-forced)")
    for ax, label in ((left, f"tau ({TREE} tree, greedy, 256 tokens)"), (right, "depth-1 acceptance")):
        ax.set_xscale("log")
        ax.set_xlabel("training conversations")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if levers:
        ax = axes[2]
        names = list(levers)
        base = results["points"].get(f"eagle1-{at}", {})
        if "mt-bench" in base and base.get("held_out"):
            names, levers = ["recipe", *names], {"recipe": base, **levers}
        taus = [levers[n]["mt-bench"]["tau"] for n in names]
        ax.barh(range(len(names)), taus, 0.6, color=["gray" if n == "recipe" else "C0" for n in names])
        for y, n in enumerate(names):  # the held-out accuracy beside each bar
            ax.text(taus[y], y, f" {levers[n]['held_out']['acc_depth1']:.3f}", va="center", fontsize=8)
        ax.set_yticks(range(len(names)), names, fontsize=8)
        ax.set_xlim(min(taus) - 0.15, max(taus) + 0.15)
        ax.set_xlabel("MT-bench tau (label: held-out depth-1 accuracy)")
        ax.set_title(f"one option changed, at {at} conversations", fontsize=9)
        ax.grid(alpha=0.3, axis="x")
    fig.suptitle("EAGLE heads for SmolLM2-135M-Instruct: one recipe, growing ShareGPT prefixes")
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
    p.add_argument("--levers", default="", help=f"after the points: recipe variants at --lever-point, 'all' or "
                   f"names separated by commas ({', '.join(LEVERS)})")
    p.add_argument("--lever-point", type=int, default=1536, help="training conversations of the levers (default 1536)")
    p.add_argument("--eagle3", type=int, default=None, help="then an EAGLE-3 head at this point (0 = all)")
    p.add_argument("--baseline", default=None, help="first measure this head (a folder or a shipped head's name, "
                   "e.g. smollm2-135m-instruct) on the same sets: the head a point must beat to ship")
    args = p.parse_args(argv)
    try:
        points = [int(x) for x in args.points.split(",") if x.strip()]
        levers = list(LEVERS) if args.levers == "all" else [x.strip() for x in args.levers.split(",") if x.strip()]
        if args.lever_point < 1:
            raise EagleError(f"--lever-point {args.lever_point}: give the levers' training conversations, 1 or more")
        unknown = [x for x in levers if x not in LEVERS]
        if unknown:
            raise EagleError(f"--levers: unknown {', '.join(unknown)}; choose from {', '.join(LEVERS)} or all")
        run(args.capture_dir, args.out, args.results, args.eval_first, points, args.time_limit, args.poll,
            levers=levers, lever_point=args.lever_point, eagle3=args.eagle3, baseline=args.baseline)
    except (EagleError, ValueError) as exc:
        print(f"{p.prog}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
