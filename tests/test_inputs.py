"""Bad inputs end in one line naming the file and the fix, never in a traceback, and the head's
own files are checked before the target loads (minutes on a busy machine)."""

import json
import subprocess
import sys

import pytest
import torch
from conftest import tiny_config
from safetensors.torch import save_file

from eaglespec.cli.commands import main
from eaglespec.draft.head import EagleHead
from eaglespec.draft.vocab import check_draft_vocab, load_draft_vocab, save_draft_vocab
from eaglespec.engine import decoding
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.engine.target import check_device, load_target, resolve_target
from eaglespec.engine.tuning import AcceptanceStats
from eaglespec.errors import EagleError

VOCAB = 128


@pytest.fixture
def head_dir(tmp_path):
    """A complete EAGLE-1 head for the tiny llama: config.json, weights, draft vocabulary, acceptance."""
    directory = tmp_path / "head"
    EagleHead(tiny_config("llama")).save_pretrained(directory)
    save_draft_vocab(directory, torch.arange(VOCAB).flip(0))
    AcceptanceStats(((0.5, 0.1),), steps=3).save(directory)
    return directory


def _damage(head_dir, case: str) -> str:
    """Damage one file of a head; -> the file's name (the message must name it)."""
    if case == "vocab_garbage":
        (head_dir / "draft_vocab.safetensors").write_bytes(b"\x00garbage")
        return "draft_vocab.safetensors"
    if case == "vocab_without_ids":
        save_file({"counts": torch.arange(VOCAB)}, head_dir / "draft_vocab.safetensors")
        return "draft_vocab.safetensors"
    if case == "acceptance_truncated":
        (head_dir / "acceptance.json").write_text('{"p": [[0.5, 0.1], [0.2')
        return "acceptance.json"
    if case == "acceptance_empty":
        (head_dir / "acceptance.json").write_text("")
        return "acceptance.json"
    if case == "config_mismatch":
        cfg = json.loads((head_dir / "config.json").read_text())
        cfg["intermediate_size"] = 100
        (head_dir / "config.json").write_text(json.dumps(cfg))
        return "config.json"
    if case == "weights_missing":
        (head_dir / "model.safetensors").unlink()
        return "model.safetensors"
    raise AssertionError(case)


CASES = ["vocab_garbage", "vocab_without_ids", "acceptance_truncated", "acceptance_empty", "config_mismatch",
         "weights_missing"]


# ---- the readers --------------------------------------------------------------------------------
@pytest.mark.parametrize("case, message", [
    ("vocab_garbage", "is not a readable safetensors file"),
    ("vocab_without_ids", "has no 'token_ids' tensor"),
])
def test_a_damaged_draft_vocabulary_is_one_line_naming_the_fix(head_dir, case, message):
    _damage(head_dir, case)
    for read in (lambda: check_draft_vocab(head_dir), lambda: load_draft_vocab(head_dir, 64, VOCAB)):
        with pytest.raises(EagleError, match=message) as info:
            read()
        text = str(info.value)
        assert "\n" not in text and str(head_dir / "draft_vocab.safetensors") in text and "--recount" in text
    assert load_draft_vocab(head_dir, None, VOCAB) is None  # not asked for: not read


@pytest.mark.parametrize("tensors, message", [
    ({"token_ids": torch.zeros(4, 32, dtype=torch.long)}, "of shape"),
    ({"token_ids": torch.rand(VOCAB)}, "not integer token ids"),
    ({"token_ids": torch.arange(VOCAB) + 5}, "belongs to another target"),
])
def test_a_draft_vocabulary_of_the_wrong_form_is_refused(tmp_path, tensors, message):
    save_file(tensors, tmp_path / "draft_vocab.safetensors")
    with pytest.raises(EagleError, match=message):
        load_draft_vocab(tmp_path, 64, VOCAB)


@pytest.mark.parametrize("content, message", [
    (b"", "is empty"),
    (b"version: 1\nthis is a text file\n", "does not start with the GGUF magic bytes"),
])
def test_a_file_named_gguf_that_is_not_one_is_refused_before_transformers(tmp_path, content, message):
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    with pytest.raises(EagleError, match=message) as info:
        resolve_target(str(path))
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_a_truncated_gguf_is_one_line(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF\x03\x00\x00\x00cut")  # the magic, then a download cut short
    with pytest.raises(EagleError, match="is not a readable GGUF file") as info:
        load_target(str(path), check=False)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name, message", [
    ("banana", "is not a device"),
    ("xla", "runs on cpu, cuda"),
    pytest.param("cuda", "sees no CUDA device", marks=pytest.mark.skipif(torch.cuda.is_available(), reason="has CUDA")),
    pytest.param("cuda:0", "sees no CUDA device", marks=pytest.mark.skipif(torch.cuda.is_available(), reason="has CUDA")),
])
def test_a_device_this_machine_lacks_is_one_line(name, message):
    with pytest.raises(EagleError, match=message) as info:
        check_device(name)
    assert "\n" not in str(info.value) and "--device cpu" in str(info.value)
    assert check_device("cpu") == torch.device("cpu")


# ---- from_pretrained checks the head before the target ----------------------------------------
@pytest.fixture
def no_target(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("the target was loaded before the head's files were checked")

    monkeypatch.setattr(decoding, "load_target", fail)


@pytest.mark.parametrize("case", CASES)
def test_head_files_are_checked_before_the_target_loads(head_dir, no_target, case):
    name = _damage(head_dir, case)
    with pytest.raises(EagleError, match=name) as info:
        EagleGenerator.from_pretrained(None, str(head_dir), "auto")
    assert "\n" not in str(info.value)


def test_acceptance_is_read_only_for_the_auto_tree(head_dir, no_target):
    _damage(head_dir, "acceptance_empty")
    with pytest.raises(AssertionError, match="target was loaded"):  # the head passed: the target is next
        EagleGenerator.from_pretrained(None, str(head_dir), "eagle1")


@pytest.mark.parametrize("kwargs, message", [
    (dict(device="banana"), "not a device"),
    (dict(tree="dynamic:4,4"), "three numbers"),
])
def test_options_are_checked_before_the_target_loads(head_dir, no_target, kwargs, message):
    with pytest.raises(EagleError, match=message):
        EagleGenerator.from_pretrained(None, str(head_dir), **{"tree": "auto", **kwargs})


# ---- the command line: exit 2, one line on stderr --------------------------------------------
def _one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("eaglespec: error: ") and "Traceback" not in err
    return err


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("command", ["generate", "chat", "serve", "bench"])
def test_the_cli_says_which_head_file_is_bad(head_dir, no_target, capsys, case, command):
    name = _damage(head_dir, case)
    assert name in _one_line_error(capsys, [command, "--head", str(head_dir)])


@pytest.mark.parametrize("argv, message", [
    (["generate", "--tree", "dynamic:4,4"], "dynamic:4,4,12"),
    (["generate", "--draft-floor", "1.5"], "--draft-floor 1.5: give a probability in [0, 1)"),
    (["bench", "--draft-floor", "-0.1"], "--draft-floor -0.1: give a probability in [0, 1)"),
    (["generate", "--draft-vocab", "-5"], "--draft-vocab -5: give a number of tokens"),
    (["generate", "--device", "banana"], "not a device"),
    pytest.param(["generate", "--device", "cuda"], "sees no CUDA device",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="has CUDA")),
    pytest.param(["tune", "--head", "HEAD", "--device", "cuda"], "sees no CUDA device",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="has CUDA")),
    (["tune", "--head", "HEAD", "--calibration-from", "-1"], "--calibration-from must be >= 0, got -1"),
    (["tune", "--head", "HEAD", "--prompts", "0"], "--prompts must be >= 1, got 0"),
    (["tune", "--head", "HEAD", "--draft-vocab", "-1"], "--draft-vocab must be >= 0, got -1"),
    (["tune", "--head", "HEAD", "--vocab-examples", "0"], "--vocab-examples must be >= 1, got 0"),
    (["serve", "--max-new-tokens", "0"], "--max-new-tokens must be >= 1, got 0"),
    (["serve", "--max-tokens-limit", "-5"], "--max-tokens-limit must be >= 1, got -5"),
    (["bench", "--methods", "vanila,auto"], "unknown method 'vanila'; comma-separated: vanilla"),
    (["bench-modes", "--methods", "vanila"], "unknown method 'vanila'"),
    (["bench", "--out", "FILE"], "--out FILE is a file"),
    (["bench-modes", "--out", "FILE"], "--out FILE is a file"),
    (["bench-batch", "--out", "FILE"], "--out FILE is a file"),
    (["certify", "--out", "FILE"], "--out FILE is a file"),
    (["capture", "--out", "FILE"], "--out FILE is a file"),
    (["distill", "--out", "FILE"], "--out FILE is a file"),
    (["bench", "--dataset", "BINARY"], "BINARY is not UTF-8 text"),
    pytest.param(["capture", "--out", "OUT", "--device", "cuda"], "sees no CUDA device",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="has CUDA")),
])
def test_the_cli_refuses_bad_options_in_one_line(head_dir, no_target, tmp_path, capsys, argv, message):
    """Before anything loads (no_target): an output path that is a file, a data file that is not
    text, a count out of range (named by its flag), a method name that is not one."""
    (tmp_path / "FILE").write_text("a file, not a folder\n")
    (tmp_path / "BINARY.jsonl").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    paths = {"HEAD": str(head_dir), "OUT": str(tmp_path / "out"), "FILE": str(tmp_path / "FILE"),
             "BINARY": str(tmp_path / "BINARY.jsonl")}
    message = message.replace("FILE", paths["FILE"]).replace("BINARY", paths["BINARY"])
    assert message in _one_line_error(capsys, [paths.get(a, a) for a in argv])


def test_a_thread_count_that_is_not_one_is_refused_in_one_line(monkeypatch, capsys):
    monkeypatch.setenv("EAGLESPEC_NUM_THREADS", "auto")
    assert "EAGLESPEC_NUM_THREADS='auto': give a whole number" in _one_line_error(capsys, ["compile", "--list"])


def test_tune_keeps_the_heads_acceptance_when_nothing_calibrates(tmp_path, monkeypatch, capsys):
    """No calibration prompt, or no calibration step: an error, and the head's measured
    acceptance.json is left as it was (it was once replaced by a table of zeros first)."""
    from bench_helpers import tiny_generator

    from eaglespec.cli import commands
    from eaglespec.draft.vocab import FILE as VOCAB_FILE
    from eaglespec.engine import tuning

    head = tmp_path / "head"
    head.mkdir()
    (head / "acceptance.json").write_text("measured\n")
    (head / VOCAB_FILE).write_text("counted\n")  # no recount
    gen = tiny_generator()
    monkeypatch.setattr(EagleGenerator, "from_pretrained", lambda *a, **k: gen)
    monkeypatch.setattr(commands, "sharegpt_prompts", lambda count, skip: [])
    assert "no usable ShareGPT prompt" in _one_line_error(capsys, ["tune", "--head", str(head), "--compile", "off"])
    monkeypatch.setattr(commands, "sharegpt_prompts", lambda count, skip: ["hello there"])
    monkeypatch.setattr(tuning, "calibrate", lambda gen, prompts, n: AcceptanceStats(((0.0, 0.0),), steps=0))
    assert "no calibration step ran" in _one_line_error(capsys, ["tune", "--head", str(head), "--compile", "off"])
    assert (head / "acceptance.json").read_text() == "measured\n"


def test_a_jsonl_file_of_another_kind_is_one_error(tmp_path):
    import gzip

    from eaglespec.files import jsonl_objects

    (tmp_path / "fake.jsonl.gz").write_text('{"a": 1}\n')
    with pytest.raises(EagleError, match="fake.jsonl.gz: cannot read it"):
        list(jsonl_objects(tmp_path / "fake.jsonl.gz", gzip.open))
    (tmp_path / "latin1.jsonl").write_bytes('{"a": "caf\xe9"}\n'.encode("latin-1"))
    with pytest.raises(EagleError, match="latin1.jsonl is not UTF-8 text"):
        list(jsonl_objects(tmp_path / "latin1.jsonl"))


def test_the_cli_refuses_a_text_file_named_gguf_without_a_traceback(tmp_path):
    """The real entry point, in its own process: what a user sees."""
    path = tmp_path / "model.gguf"
    path.write_text("not a model\n")
    proc = subprocess.run([sys.executable, "-m", "eaglespec.cli", "generate", "--target", str(path), "--head", "none"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in proc.stderr
    assert str(path) in err and "not a GGUF file" in err


@pytest.mark.parametrize("flags, size, context", [([], 4096, True), (["--draft-vocab", "8192"], 8192, True),
                                                  (["--draft-vocab", "0"], None, True), (["--no-draft-context"], 4096, False)])
@pytest.mark.parametrize("command", ["generate", "bench"])
def test_draft_vocab_option_reaches_the_generator(monkeypatch, capsys, command, flags, size, context):
    seen = {}

    def from_pretrained(*args, **kwargs):
        seen.update(kwargs)
        raise EagleError("stopped before loading")

    monkeypatch.setattr(EagleGenerator, "from_pretrained", from_pretrained)
    assert "stopped before loading" in _one_line_error(capsys, [command, "--head", "none", *flags])
    assert seen["draft_vocab_size"] == size and seen["context_vocab"] is context


def test_tune_calibrates_with_decodings_draft_vocabulary_and_context_tokens():
    from eaglespec.cli.commands import build_parser
    from eaglespec.draft.vocab import DEFAULT_SIZE

    args = build_parser().parse_args(["tune", "--head", "h"])
    assert args.draft_vocab == DEFAULT_SIZE and args.draft_context is True
    assert build_parser().parse_args(["tune", "--head", "h", "--no-draft-context"]).draft_context is False
