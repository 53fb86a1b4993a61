"""The GPU head recipe, prepared on CPU: its bundle round-trips, and its dry run writes both heads."""

import json

import pytest
import torch
from test_train_capture import synthetic_examples

from eaglespec.errors import EagleError
from eaglespec.gpu_recipe import join_file, main, pack_examples, split_file, unpack_examples


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
    assert join_file(tmp_path / "bundle", info, tmp_path / "work").read_bytes() == source.read_bytes()
    (tmp_path / "bundle" / "b" / "model.part").write_bytes(b"corrupt")
    with pytest.raises(EagleError, match="SHA-256"):
        join_file(tmp_path / "bundle", info, tmp_path / "work")
    (tmp_path / "bundle" / "a" / "model.part").unlink()
    with pytest.raises(EagleError, match="send .device/a"):
        join_file(tmp_path / "bundle", info, tmp_path / "work")


@pytest.mark.slow
def test_dry_run_on_cpu_writes_both_heads(tmp_path):
    assert main(["bundle", "--out", str(tmp_path / "bundle"), "--conversations", "6", "--max-length", "256",
                 "--no-wheels"]) == 0
    sizes = {p: sum(f.stat().st_size for f in (tmp_path / "bundle" / p).rglob("*")) for p in ("a", "b")}
    assert all(s < 60 * 2 ** 20 for s in sizes.values()), sizes  # each part travels in one device call
    out = tmp_path / "out"
    assert main(["run", "--bundle", str(tmp_path / "bundle"), "--out", str(out), "--device", "cpu", "--dry-run"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["heads"]) == {"eagle3", "eagle1"}
    assert all(h["steps"] == 2 and h["mt_bench"]["tau"] >= 1.0 for h in summary["heads"].values())
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8 and all(p.stat().st_size <= 16 * 2 ** 20 for p in files)
    from eaglespec.draft.heads import load_head, read_head_files

    cfg, _, _ = read_head_files(out / "eagle3")
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert not (out / "work").exists()
    with pytest.raises(SystemExit):
        main(["run", "--bundle", str(tmp_path / "bundle"), "--out", str(out), "--device", "cuda"])
    del load_head
