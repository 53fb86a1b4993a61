"""Dequantized copies of GGUF targets (engine/gguf_copy.py): kept atomically, keyed, trusted only
whole, rebuilt when damaged; and for the real default target, the copy is the .gguf's model."""

import json
import os
import shutil

import pytest
import torch
from bench_helpers import tiny_tokenizer
from conftest import tiny_config, tiny_model

from eaglespec.engine import gguf_copy


def _hf(dtype):
    from eaglespec.engine.target import _load_hf

    return lambda folder: _load_hf(str(folder), None, dtype, None)


@pytest.fixture
def copies(tmp_path, monkeypatch):
    monkeypatch.setenv(gguf_copy.COPIES_ENV, str(tmp_path / "copies"))
    source = tmp_path / "model.gguf"
    source.write_bytes(b"GGUF stand-in: only its path, size and time are read")
    return source


def test_a_copy_round_trips_and_is_keyed_by_the_file_and_dtype(copies, capsys):
    from transformers import AutoModelForCausalLM

    config = tiny_config("llama")
    config.tie_word_embeddings = True  # as SmolLM2's: the LM head is the embedding
    model, tokenizer = AutoModelForCausalLM.from_config(config), tiny_tokenizer()
    folder, key = gguf_copy.locate(copies, torch.float32)
    assert gguf_copy.load(folder, key, _hf(torch.float32)) is None  # nothing kept yet
    gguf_copy.write(folder, key, model, tokenizer)
    assert "kept a dequantized copy" in capsys.readouterr().err
    assert not list(folder.parent.glob(".*partial*"))
    tok, back = gguf_copy.load(folder, key, _hf(torch.float32))
    mine, theirs = model.state_dict(), back.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert back.lm_head.weight.data_ptr() == back.model.embed_tokens.weight.data_ptr()  # still tied
    assert tok("hello world")["input_ids"] == tokenizer("hello world")["input_ids"]
    assert "quantization_config" not in back.config.to_dict()
    # another dtype, a changed file, copies switched off: other folders, or none
    assert gguf_copy.locate(copies, torch.bfloat16)[0] != folder
    os.utime(copies, ns=(0, 12345))
    assert gguf_copy.locate(copies, torch.float32)[0] != folder
    os.environ[gguf_copy.COPIES_ENV] = "off"
    assert gguf_copy.locate(copies, torch.float32) is None


def test_an_unfinished_or_damaged_copy_is_never_trusted(copies, capsys):
    model, tokenizer = tiny_model("llama", 0, torch.float32), tiny_tokenizer()
    folder, key = gguf_copy.locate(copies, torch.float32)
    gguf_copy.write(folder, key, model, tokenizer)
    (folder / gguf_copy.KEY_FILE).unlink()  # as a write interrupted before its last file
    assert gguf_copy.load(folder, key, _hf(torch.float32)) is None
    gguf_copy.write(folder, key, model, tokenizer)  # written again over the leftover
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    capsys.readouterr()
    assert gguf_copy.load(folder, key, _hf(torch.float32)) is None
    assert "ignored the damaged copy" in capsys.readouterr().err and not folder.exists()


def test_writing_a_copy_removes_those_no_start_can_load_again(copies, tmp_path, capsys):
    model, tokenizer = tiny_model("llama", 0, torch.float32), tiny_tokenizer()
    old, old_key = gguf_copy.locate(copies, torch.float32)
    gguf_copy.write(old, old_key, model, tokenizer)
    bf16, bf16_key = gguf_copy.locate(copies, torch.bfloat16)  # another dtype of the same file: kept
    gguf_copy.write(bf16, bf16_key, model, tokenizer)
    gone = tmp_path / "joined.gguf"  # a file joined in a temporary folder, later deleted
    gone.write_bytes(b"x")
    lost, lost_key = gguf_copy.locate(gone, torch.float32)
    gguf_copy.write(lost, lost_key, model, tokenizer)
    other = tmp_path / "other.gguf"  # another file that still exists: kept
    other.write_bytes(b"y")
    kept, kept_key = gguf_copy.locate(other, torch.float32)
    gguf_copy.write(kept, kept_key, model, tokenizer)
    gone.unlink()
    (old.parent / "stray").mkdir()  # not a copy: left alone
    keep = [bf16.name, kept.name, "stray"]
    for name, changes in (("other-versions", {"transformers": "0.0"}), ("unmounted", {"file": "/no/such/mount/m.gguf"}),
                          (".half-written", {})):  # another environment's copy, a share not mounted, a write under way
        folder = old.parent / name
        shutil.copytree(old, folder)
        (folder / gguf_copy.KEY_FILE).write_text(json.dumps({"key": {**old_key, **changes}}))
        keep.append(name)
    (old.parent / "link").symlink_to(old.parent / "other-versions")
    keep.append("link")
    os.utime(copies, ns=(0, 12345))  # the .gguf rewritten: its fp32 copy is superseded
    new, new_key = gguf_copy.locate(copies, torch.float32)
    capsys.readouterr()
    gguf_copy.write(new, new_key, model, tokenizer)
    assert "removed 2 older copies" in capsys.readouterr().err
    assert sorted(p.name for p in old.parent.iterdir()) == sorted([new.name, *keep])
    (new / gguf_copy.KEY_FILE).write_text(json.dumps({"key": "not a key"}))  # unreadable keys never fail a write
    gguf_copy.write(bf16, bf16_key, model, tokenizer)


def test_an_unwritable_folder_only_costs_the_copy(copies, tmp_path, capsys, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(gguf_copy.COPIES_ENV, str(blocker / "copies"))
    folder, key = gguf_copy.locate(copies, torch.float32)
    gguf_copy.write(folder, key, tiny_model("llama", 0, torch.float32), tiny_tokenizer())  # no exception
    assert "no dequantized copy of the target kept" in capsys.readouterr().err


@pytest.mark.slow
def test_the_default_targets_copy_is_its_gguf_model(tmp_path, monkeypatch):
    """SmolLM2 from its .gguf, then from the copy that load kept: the same tensors, config,
    generation config, tokenizer (chat template included) and fingerprint."""
    from eaglespec.engine import target as target_module

    monkeypatch.setenv(gguf_copy.COPIES_ENV, str(tmp_path / "copies"))
    first = target_module.load_target(None, check=False)
    assert len(list((tmp_path / "copies").iterdir())) == 1

    real = target_module._load_hf

    def only_the_copy(folder, gguf, *args):
        assert gguf is None, "the .gguf was read again"
        return real(folder, gguf, *args)

    monkeypatch.setattr(target_module, "_load_hf", only_the_copy)
    second = target_module.load_target(None, check=False)
    a, b = first.model.state_dict(), second.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert first.fingerprint() == second.fingerprint()
    ca, cb = first.model.config.to_dict(), second.model.config.to_dict()
    assert {k for k in set(ca) | set(cb) if ca.get(k) != cb.get(k)} <= {"_name_or_path", "quantization_config"}
    assert first.model.generation_config.to_dict() == second.model.generation_config.to_dict()
    messages = [{"role": "user", "content": "Écris un poème 🙂 about rivers\n\n  twice"}]
    assert (first.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
            == second.tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    ids = list(range(0, first.vocab_size, 97))
    assert first.tokenizer.decode(ids) == second.tokenizer.decode(ids)
