"""The data-scaling driver (train/scaling.py) with fake training and measurement: it waits for a
growing capture, trains each point on one held-out split, measures every set once, keeps results
after every step, and resumes."""

import argparse
import json
import threading

import pytest

from eaglespec.errors import EagleError
from eaglespec.train import scaling
from eaglespec.train.capture import FORMAT, MANIFEST
from eaglespec.train.cli import add_train_parser
from eaglespec.train.config import TrainConfig, config_from_args


def write_manifest(capture, examples, complete=False):
    capture.mkdir(exist_ok=True)
    (capture / MANIFEST).write_text(json.dumps({"format": FORMAT, "examples": examples, "complete": complete}))


class Fakes:
    def __init__(self, stop_at_time_limit=(), differ=()):
        self.trained, self.measured = [], []
        self.stop_at_time_limit, self.differ = set(stop_at_time_limit), set(differ)

    def train(self, argv):
        out = scaling.Path(argv[argv.index("--out") + 1])
        self.trained.append(argv)
        out.mkdir(parents=True, exist_ok=True)
        k = int(argv[argv.index("--train-examples") + 1])
        if k in self.stop_at_time_limit:
            self.stop_at_time_limit.discard(k)
            (out / "checkpoint.pt").write_bytes(b"")
            return 0
        (out / "checkpoint.pt").unlink(missing_ok=True)
        (out / scaling.WEIGHTS).write_bytes(b"weights")
        (out / "metrics.jsonl").write_text(json.dumps({"kind": "eval", "acc_depth1": k / 10_000}) + "\n")
        return 0

    def acceptance(self, argv):
        self.measured.append(argv)
        out = scaling.Path(argv[argv.index("--out") + 1])
        out.mkdir(parents=True, exist_ok=True)
        head = argv[argv.index("--head") + 1]
        identical = 0 if head in self.differ else 3
        row = {"tau": 1.5 + len(self.measured) / 100, "n_alpha": [0.5, 0.3, 0.2, 0.1], "identical": identical,
               "prompts": 3}
        (out / "results.json").write_text(json.dumps({"rows": [row]}))
        return 0


def test_points_wait_for_the_capture_train_on_one_split_and_resume(tmp_path):
    capture, out, results = tmp_path / "capture", tmp_path / "runs", tmp_path / "docs" / "scaling.json"
    write_manifest(capture, 10)
    fakes = Fakes(stop_at_time_limit={4})
    run = lambda: scaling.run(capture, out, results, 2, [4, 0], time_limit=5, poll_s=0.01,
                              train_main=fakes.train, acceptance_main=fakes.acceptance)
    # the first run stops at the time limit of point 4: nothing measured yet, nothing lost
    got = run()
    assert "held_out" not in got["points"]["eagle1-4"] and not fakes.measured
    # the next run continues point 4, measures it, then waits for the capture to complete
    threading.Timer(0.3, write_manifest, (capture, 12, True)).start()
    got = run()
    first, second, third = fakes.trained
    assert first == second and first[first.index("--eval-first") + 1] == "2" and "--partial" in first
    assert third[third.index("--train-examples") + 1] == "10"  # "all": the complete capture less the held-out 2
    assert set(got["points"]) == {"eagle1-4", "eagle1-10"}
    for point in got["points"].values():
        assert set(point) == {"train_examples", "held_out", "mt-bench", "humaneval-40", "tasks"}
    assert len(fakes.measured) == 6 and [a[a.index("--limit") + 1] for a in fakes.measured if "--limit" in a] == ["40", "40"]
    assert json.loads(results.read_text()) == got and results.with_suffix(".png").is_file()
    # everything done: a rerun trains and measures nothing
    run()
    assert len(fakes.trained) == 3 and len(fakes.measured) == 6


def test_a_point_whose_eagle_output_differs_is_an_error(tmp_path):
    capture = tmp_path / "capture"
    write_manifest(capture, 10)
    fakes = Fakes(differ={str(tmp_path / "runs" / "eagle1-4")})
    with pytest.raises(EagleError, match="differs from vanilla"):
        scaling.run(capture, tmp_path / "runs", tmp_path / "s.json", 2, [4], None, 0.01,
                    train_main=fakes.train, acceptance_main=fakes.acceptance)


def test_a_head_trained_but_not_recorded_is_not_trained_again(tmp_path):
    capture, out = tmp_path / "capture", tmp_path / "runs"
    write_manifest(capture, 10)
    fakes = Fakes()
    fakes.train(["train", "--out", str(out / "eagle1-4"), "--train-examples", "4"])  # then the process died
    got = scaling.run(capture, out, tmp_path / "s.json", 2, [4], None, 0.01, train_main=fakes.train,
                      acceptance_main=fakes.acceptance)
    assert len(fakes.trained) == 1 and got["points"]["eagle1-4"]["held_out"] == {"kind": "eval", "acc_depth1": 0.0004}


def test_levers_change_one_option_each_on_the_same_split_and_eagle3_trains_from_the_same_capture(tmp_path):
    capture, out, results = tmp_path / "capture", tmp_path / "runs", tmp_path / "docs" / "scaling.json"
    write_manifest(capture, 10, complete=True)
    fakes = Fakes()
    run = lambda: scaling.run(capture, out, results, 2, [4], None, 0.01, train_main=fakes.train,  # noqa: E731
                              acceptance_main=fakes.acceptance, levers=["lr-3e-4", "loss-vocab-full"],
                              lever_point=4, eagle3=0)
    got = run()
    base, lr, vocab, eagle3 = fakes.trained
    value = lambda argv, flag: argv[argv.index(flag) + 1]  # noqa: E731
    assert value(base, "--lr") == "6e-4" and value(lr, "--lr") == "3e-4" and lr.count("--lr") == 1
    assert value(vocab, "--loss-vocab") == "49152" and value(vocab, "--lr") == "6e-4"
    assert {value(a, "--eval-first") for a in fakes.trained} == {"2"}  # one held-out split for all
    assert value(lr, "--train-examples") == "4" and value(eagle3, "--train-examples") == "8"  # 0: the whole capture
    assert value(eagle3, "--head") == "eagle3" and value(eagle3, "--out").endswith("eagle3-8")
    assert set(got["levers"]) == {"eagle1-4-lr-3e-4", "eagle1-4-loss-vocab-full"}  # keyed by point and lever
    lever = got["levers"]["eagle1-4-lr-3e-4"]
    assert set(lever) == {"lever", "train_examples", "changes", "held_out", "mt-bench"}  # levers: MT-bench only
    assert lever["train_examples"] == 4 and lever["changes"] == ["--lr", "3e-4"]
    assert set(got["eagle3"]["eagle3-8"]) == {"train_examples", "held_out", "mt-bench", "humaneval-40", "tasks"}
    assert all(value(a, "--compile") == "off" for a in fakes.measured)  # tau on the eager kernels
    assert len(fakes.measured) == 3 + 2 + 3
    assert json.loads(results.read_text()) == got and results.with_suffix(".png").stat().st_size > 0
    run()  # all done: nothing again
    assert len(fakes.trained) == 4 and len(fakes.measured) == 8


def test_an_unknown_lever_is_one_line(tmp_path, capsys):
    assert scaling.main(["--capture-dir", str(tmp_path), "--levers", "lr-3e-4,more-data"]) == 2
    err = capsys.readouterr().err
    assert "unknown more-data" in err and "epochs-10" in err and len(err.strip().splitlines()) == 1
    assert scaling.main(["--capture-dir", str(tmp_path), "--levers", "all", "--lever-point", "0"]) == 2
    assert "--lever-point 0" in capsys.readouterr().err


def test_the_baseline_head_is_measured_once_on_the_same_sets(tmp_path):
    capture, out, results = tmp_path / "capture", tmp_path / "runs", tmp_path / "s.json"
    write_manifest(capture, 10)
    fakes = Fakes()
    run = lambda: scaling.run(capture, out, results, 2, [4], None, 0.01, train_main=fakes.train,  # noqa: E731
                              acceptance_main=fakes.acceptance, baseline="smollm2-135m-instruct")
    got = run()
    heads = [a[a.index("--head") + 1] for a in fakes.measured]
    assert heads[:3] == ["smollm2-135m-instruct"] * 3 and heads[3:] == [str(out / "eagle1-4")] * 3
    assert set(got["baseline"]["smollm2-135m-instruct"]) == {"mt-bench", "humaneval-40", "tasks"}
    run()
    assert len(fakes.measured) == 6


@pytest.mark.parametrize("name", sorted(scaling.LEVERS))
def test_each_lever_is_a_real_train_option_and_changes_only_its_own_value(name, tmp_path):
    parser = argparse.ArgumentParser()
    add_train_parser(parser.add_subparsers(dest="command"))

    def config(recipe):
        return config_from_args(TrainConfig, parser.parse_args(["train", "--capture-dir", str(tmp_path),
                                                                "--out", str(tmp_path / "h"), *recipe]))

    changes = scaling.LEVERS[name]
    base, lever = config(list(scaling.RECIPE)), config(scaling._recipe(scaling.RECIPE, changes))
    changed = {f for f in vars(base) if getattr(base, f) != getattr(lever, f)}
    assert changed == {flag[2:].replace("-", "_") for flag in changes[::2]}, (name, changed)  # the options it names
    config(list(scaling.EAGLE3_RECIPE))  # the EAGLE-3 recipe parses too
