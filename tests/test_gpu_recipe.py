"""The GPU head recipe, prepared on CPU: its bundle round-trips, and its dry run writes both heads."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_train_capture import synthetic_examples

from eaglespec.errors import EagleError
from eaglespec.tools.device_tree import CALL_BYTES

ROOT = Path(__file__).resolve().parents[1]
from eaglespec.tools.gpu_recipe import (PROMPTS, distill_examples, join_file, main, pack_examples, pack_prompts,
                                        split_file, unpack_examples)


def test_examples_and_model_parts_round_trip(tmp_path):
    examples = synthetic_examples(9)
    counts = pack_examples(examples, tmp_path / "ex.npz")
    assert counts == {"examples": 9, "tokens": sum(len(e.input_ids) for e in examples)}
    again = unpack_examples(tmp_path / "ex.npz")
    assert all(torch.equal(a.input_ids, b.input_ids) and torch.equal(a.loss_mask, b.loss_mask)
               for a, b in zip(examples, again)) and len(again) == 9
    assert len(unpack_examples(tmp_path / "ex.npz", limit=4)) == 4
    source = tmp_path / "model.gguf"
    source.write_bytes(bytes(range(256)) * 41 + b"x")
    info = split_file(source, tmp_path / "bundle")
    joined = join_file(tmp_path / "bundle", info, tmp_path / "work")
    assert joined.read_bytes() == source.read_bytes()
    os.utime(joined, ns=(0, 12345))
    assert join_file(tmp_path / "bundle", info, tmp_path / "work").stat().st_mtime_ns == 12345  # unchanged: not rewritten
    (tmp_path / "bundle" / "b" / "model.part").write_bytes(b"corrupt")
    with pytest.raises(EagleError, match="SHA-256"):
        join_file(tmp_path / "bundle", info, tmp_path / "work")
    (tmp_path / "bundle" / "a" / "model.part").unlink()
    with pytest.raises(EagleError, match="send .device/a"):
        join_file(tmp_path / "bundle", info, tmp_path / "work")


def test_distilled_examples_are_the_targets_greedy_replies_with_the_reply_masked(tmp_path):
    from test_train_distill import EOS, make_target

    target = make_target()
    tok = target.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": "Say " + "abcdefg"[:n]}], tokenize=True,
                                       add_generation_prompt=True, return_dict=False) for n in (1, 4, 2, 7, 3)]
    pack_prompts(prompts, tmp_path / PROMPTS)
    back = [e.input_ids for e in unpack_examples(tmp_path / PROMPTS)]
    assert [b.tolist() for b in back] == prompts
    examples, counts = distill_examples(target, back, max_new_tokens=6, batch_size=2, seconds=None)
    assert counts["conversations"] == len(examples) == 5
    for prompt, example in zip(prompts, examples):  # in prompt order, though batched longest first
        ids, mask = example.input_ids.tolist(), example.loss_mask
        assert ids[:len(prompt)] == prompt and not mask[:len(prompt)].any() and mask[len(prompt):].all()
        new = []
        with torch.no_grad():  # the reference: plain forwards, argmax, no padding, no cache
            while len(new) < 6 and (not new or new[-1] != EOS):
                new.append(int(target.model(input_ids=torch.tensor([prompt + new])).logits[0, -1].argmax()))
        assert ids[len(prompt):] == new  # the end-of-sequence id, when it came, is part of the reply
    assert counts["new_tokens"] == sum(int(e.loss_mask.sum()) for e in examples)
    assert 0 < counts["cut_replies"] < 5  # some replies ended, some were cut: both paths ran
    few, _ = distill_examples(target, back, max_new_tokens=6, batch_size=2, seconds=0.0)
    assert len(few) == 2  # out of time after the first batch


def test_tau_starts_no_question_once_its_time_is_spent():
    from test_train_distill import make_target

    from eaglespec.draft.head import EagleHead
    from eaglespec.tools.gpu_recipe import _tau

    target = make_target()
    torch.manual_seed(0)
    head = EagleHead(target.config).to(target.dtype)
    questions = ["Say a", "Say ab", "Say abc"]
    whole = _tau(target, head, questions, 4, "eagle1")
    assert whole["questions"] == whole["of"] == 3 and whole["tau"] >= 1.0
    cut = _tau(target, head, questions, 4, "eagle1", seconds=0.0)
    assert cut["questions"] == 1 and cut["of"] == 3  # the first always runs


@pytest.mark.slow
def test_dry_run_on_cpu_writes_both_heads(tmp_path):
    assert main(["bundle", "--out", str(tmp_path / "bundle"), "--conversations", "6", "--max-length", "256",
                 "--no-wheels"]) == 0
    sizes = {p: sum(f.stat().st_size for f in (tmp_path / "bundle" / p).rglob("*")) for p in ("a", "b")}
    calls = json.loads((tmp_path / "bundle" / "b" / "bundle.json").read_text())["calls"]
    assert all(s + calls["tree"] <= CALL_BYTES for s in sizes.values()), sizes  # each part and the slim tree: one call
    assert sizes["a"] == calls["model_first"] == CALL_BYTES - calls["tree"]  # part a is full (no wheels here)
    head = next((tmp_path / "bundle" / "b" / "head").iterdir())  # the shipped head, in bf16, loads
    assert {str(t.dtype) for t in load_file(head / "model.safetensors").values()} == {"torch.bfloat16"}
    # the recipe as the device's second call runs it: scripts/device-call2.sh, the check, then the recipe
    env = {**os.environ, "PY": sys.executable, "SITE": str(tmp_path / "site"), "OUT": str(tmp_path / "back"),
           "DEV": "cpu", "DRY": "1", "BUNDLE": str(tmp_path / "bundle"), "WORK": str(tmp_path)}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "device-call2.sh"), "900"], env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0 and "check exit 0" in done.stdout and "recipe exit 0" in done.stdout, done.stdout
    back = {p.name: p for p in (tmp_path / "back").iterdir()}  # what a call would bring back: at most 8 files
    assert len(back) <= 8 and {"check.log", "check-summary.json", "recipe.log", "small.tgz",
                               "eagle1-model.safetensors"} <= set(back)
    assert json.loads(back["check-summary.json"].read_text())["ok"]
    with tarfile.open(back["small.tgz"]) as tar:
        assert {"check/summary.md", "recipe/summary.json", "recipe/eagle3/config.json"} <= set(tar.getnames())
    out = tmp_path / "recipe"
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["heads"]) == {"eagle3", "eagle1"}
    assert summary["data"] == "sharegpt" and summary["examples_available"] == 6 and "distill" not in summary
    assert all(h["steps"] == 2 and h["mt_bench"]["tau"] >= 1.0 for h in summary["heads"].values())
    distilled = tmp_path / "out-distill"  # the same stages on the target's own replies to the bundle's prompts
    assert main(["run", "--bundle", str(tmp_path / "bundle"), "--out", str(distilled), "--device", "cpu", "--dry-run",
                 "--data", "distill"]) == 0
    other = json.loads((distilled / "summary.json").read_text())
    assert other["data"] == "distill" and other["distill"]["conversations"] == other["examples_available"] == 6
    assert 0 < other["distill"]["new_tokens"] <= 6 * 8 and all(h["steps"] == 2 for h in other["heads"].values())
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8 and all(p.stat().st_size <= 16 * 2 ** 20 for p in files)
    from eaglespec.draft.contract import read_head_files
    from eaglespec.draft.heads import load_head

    cfg, _, _ = read_head_files(out / "eagle3")
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert not (out / "work").exists()
    with pytest.raises(SystemExit):
        main(["run", "--bundle", str(tmp_path / "bundle"), "--out", str(out), "--device", "cuda"])
    del load_head
