"""Feature capture on a tiny random model: round trip, resumption, refusals, online features."""

import json

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from conftest import paused_for_a_while, tiny_target
from eaglespec.errors import EagleError
from eaglespec.train.capture import MANIFEST, FeatureDataset, OnlineDataset, capture
from eaglespec.train.config import CaptureConfig
from eaglespec.train.data import Example


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models: a second thread only adds contention (tenfold on a busy 2-core machine)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def synthetic_examples(n=7, vocab=128, seed=0) -> list[Example]:
    g = torch.Generator().manual_seed(seed)
    examples = []
    for _ in range(n):
        t = int(torch.randint(8, 24, (1,), generator=g))
        mask = torch.zeros(t, dtype=torch.bool)
        mask[t // 2:] = True
        examples.append(Example(torch.randint(3, vocab, (t,), generator=g), mask))
    return examples


class Interrupted(Exception):
    pass


class FailingTarget:
    """The target, interrupted (as by Ctrl-C or a crash) on its `calls`-th forward."""

    def __init__(self, target, calls):
        self.target, self.calls = target, calls

    def __getattr__(self, name):
        return getattr(self.target, name)

    def capture_states(self, input_ids, attention_mask=None, layers=None):
        self.calls -= 1
        if self.calls < 0:
            raise Interrupted
        return self.target.capture_states(input_ids, attention_mask, layers)


@pytest.fixture(scope="module")
def target():
    return tiny_target(dtype=torch.float32, check=False)


CONFIG = CaptureConfig(data="synthetic", shard_size=2)


def test_round_trip(target, tmp_path):
    examples = synthetic_examples()
    manifest = capture(target, CONFIG, tmp_path, examples=examples, progress=False)
    assert manifest["complete"] and manifest["examples"] == 7 and len(manifest["shards"]) == 4
    assert manifest["target"] == target.identity() and manifest["feature_dtype"] == "bf16"
    data = FeatureDataset(tmp_path)
    assert len(data) == 7
    for example, sample in zip(examples, (data[i] for i in range(len(data)))):
        assert torch.equal(sample.input_ids, example.input_ids) and torch.equal(sample.loss_mask, example.loss_mask)
        assert sample.features.dtype == torch.bfloat16
        reference = target.features(example.input_ids[None])[0]
        torch.testing.assert_close(sample.features.float(), reference, rtol=1e-2, atol=1e-2)


def chat_file(path, n=7):
    """n ShareGPT conversations in the tiny tokenizer's words, one without an assistant turn."""
    rows = [{"conversations": [{"from": "human", "value": " ".join(f"w{10 + (i * j) % 90}" for j in range(3 + i))},
                               {"from": "gpt", "value": " ".join(f"w{20 + (i + j) % 80}" for j in range(4 + i))}]}
            for i in range(n)]
    rows.insert(3, {"conversations": [{"from": "human", "value": "w7 w8"}]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def without_timings(manifest: dict) -> dict:
    """A manifest without what differs from run to run: each shard's seconds and peak memory."""
    for shard in manifest["shards"]:
        assert shard.pop("seconds") >= 0 and shard.pop("peak_rss_mb") > 0
    return manifest


@pytest.mark.parametrize("source", ["examples", "file"])
def test_resumed_capture_equals_uninterrupted(target, tmp_path, source):
    from bench_helpers import tiny_tokenizer

    if source == "file":  # the command's path: conversations read and rendered with the chat template
        examples, config = None, CaptureConfig(data=str(chat_file(tmp_path / "chats.jsonl")), shard_size=2)
        target = tiny_target(dtype=torch.float32, check=False)
        target.tokenizer = tiny_tokenizer(target.vocab_size)
    else:
        examples, config = synthetic_examples(), CONFIG
    capture(target, config, tmp_path / "whole", examples=examples, progress=False)
    with pytest.raises(Interrupted):
        capture(FailingTarget(target, calls=5), config, tmp_path / "cut", examples=examples, progress=False)
    manifest = json.loads((tmp_path / "cut" / MANIFEST).read_text())
    assert (manifest["complete"], len(manifest["shards"]), manifest["examples"]) == (False, 2, 4)
    with pytest.raises(EagleError, match="incomplete"):
        FeatureDataset(tmp_path / "cut")
    # The rerun starts at example 4: a target that fails on a fifth forward would show a restart.
    capture(FailingTarget(target, calls=3), config, tmp_path / "cut", examples=examples, progress=False)
    whole, cut = (without_timings(json.loads((tmp_path / d / MANIFEST).read_text())) for d in ("whole", "cut"))
    assert whole == cut
    if source == "file":
        assert whole["examples"] == 7 and whole["summary"]["skipped_no_assistant"] == 1
    for shard in whole["shards"]:
        a, b = (load_file(tmp_path / d / shard["file"]) for d in ("whole", "cut"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not list((tmp_path / "cut").glob("*.tmp"))


def test_resume_refuses_a_changed_data_file(tmp_path):
    from bench_helpers import tiny_tokenizer

    target = tiny_target(dtype=torch.float32, check=False)
    target.tokenizer = tiny_tokenizer(target.vocab_size)
    data = chat_file(tmp_path / "chats.jsonl")
    config = CaptureConfig(data=str(data), shard_size=2)
    with pytest.raises(Interrupted):
        capture(FailingTarget(target, calls=3), config, tmp_path / "cap", progress=False)
    chat_file(data, n=9)  # the file changed between the runs: the examples counted so far may differ
    with pytest.raises(EagleError, match="changed since .* SHA-256"):
        capture(target, config, tmp_path / "cap", progress=False)
    assert capture(target, config, tmp_path / "cap", overwrite=True, progress=False)["examples"] == 9


def test_refuses_another_target_or_other_options(target, tmp_path):
    examples = synthetic_examples()
    with pytest.raises(Interrupted):
        capture(FailingTarget(target, calls=2), CONFIG, tmp_path, examples=examples, progress=False)
    other = tiny_target(seed=1, dtype=torch.float32, check=False)
    with pytest.raises(EagleError, match="made for target .*fingerprint"):
        capture(other, CONFIG, tmp_path, examples=examples, progress=False)
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    (tmp_path / MANIFEST).write_text(json.dumps({**manifest, "target": {**manifest["target"], "fingerprint": "258dbcd3"}}))
    with pytest.raises(EagleError, match="older eaglespec.*--overwrite"):  # a v1 fingerprint
        capture(target, CONFIG, tmp_path, examples=examples, progress=False)
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(EagleError, match="other options \\(feature_dtype\\)"):
        capture(target, CaptureConfig(data="synthetic", shard_size=2, feature_dtype="fp16"), tmp_path,
                examples=examples, progress=False)
    manifest = capture(target, CaptureConfig(data="synthetic", shard_size=2, feature_dtype="fp32"), tmp_path,
                       examples=examples, overwrite=True, progress=False)
    assert manifest["complete"] and FeatureDataset(tmp_path)[0].features.dtype == torch.float32
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(EagleError, match="not empty and holds no capture"):
        capture(target, CONFIG, tmp_path / "other", examples=examples, progress=False)
    with pytest.raises(EagleError, match="no manifest.json"):
        FeatureDataset(tmp_path / "other")


def test_online_dataset_computes_the_same_features(target):
    examples = synthetic_examples(2)
    data = OnlineDataset(target, examples)
    assert len(data) == 2 and data.identity == target.identity()
    assert torch.equal(data[1].features, target.features(examples[1].input_ids[None])[0])


def test_a_full_disk_stops_the_capture_resumably(target, tmp_path, monkeypatch):
    import errno

    import eaglespec.train.capture as capture_module

    examples = synthetic_examples()
    capture(target, CONFIG, tmp_path / "whole", examples=examples, progress=False)
    real, calls = capture_module.save_file, []

    def filling_disk(tensors, path):  # the third shard meets a full disk halfway through its file
        calls.append(path)
        if len(calls) == 3:
            with open(path, "wb") as f:
                f.write(b"half a shard")
            # what safetensors raises (its Rust I/O error as text), checked under RLIMIT_FSIZE below
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        real(tensors, path)

    monkeypatch.setattr(capture_module, "save_file", filling_disk)
    with pytest.raises(EagleError, match=r"disk .* is full .* shard 2: the 2 complete shard\(s\) \(4 conversations\) are kept"):
        capture(target, CONFIG, tmp_path / "cut", examples=examples, progress=False)
    manifest = json.loads((tmp_path / "cut" / MANIFEST).read_text())
    assert (manifest["complete"], len(manifest["shards"]), manifest["examples"]) == (False, 2, 4)
    assert sorted(p.name for p in (tmp_path / "cut").iterdir()) == [MANIFEST, "shard-00000.safetensors",
                                                                    "shard-00001.safetensors"]
    monkeypatch.setattr(capture_module, "save_file", real)  # space freed: the same command continues
    capture(target, CONFIG, tmp_path / "cut", examples=examples, progress=False)
    whole, cut = (without_timings(json.loads((tmp_path / d / MANIFEST).read_text())) for d in ("whole", "cut"))
    assert whole == cut


def test_safetensors_reports_a_write_error_as_text_with_the_os_error_number(tmp_path):
    """The fake writer above raises what the real one does: a file-size limit (os error 27, the
    closest a test gets to a full disk without one) comes back as a SafetensorError naming it."""
    import subprocess
    import sys

    code = ("import resource, torch\nfrom safetensors.torch import save_file\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
            "import signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            f"save_file({{'x': torch.zeros(10_000)}}, {str(tmp_path / 'x.safetensors')!r})\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode != 0 and "SafetensorError" in done.stderr and "(os error 27)" in done.stderr


def test_other_write_errors_are_not_called_a_full_disk(target, tmp_path, monkeypatch):
    import eaglespec.train.capture as capture_module

    def broken(tensors, path):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(capture_module, "save_file", broken)
    with pytest.raises(PermissionError):
        capture(target, CONFIG, tmp_path, examples=synthetic_examples(), progress=False)


def test_a_pause_file_holds_the_capture_between_conversations(target, tmp_path, monkeypatch):
    tmp_path.mkdir(exist_ok=True)
    forwards = []
    counting = FailingTarget(target, calls=100)
    original = counting.capture_states
    counting.capture_states = lambda *a, **k: forwards.append(1) or original(*a, **k)
    with paused_for_a_while(tmp_path, forwards, monkeypatch) as seen_paused:
        manifest = capture(counting, CONFIG, tmp_path, examples=synthetic_examples(), progress=False)
    assert seen_paused.is_set() and manifest["complete"] and len(forwards) == 7


def test_a_looping_reply_leaves_the_loss_after_its_first_repeat():
    """cut_loops: in each reply (a run of loss-mask positions) the loss stops after the first
    repeat of a span-token stretch; the example ends at the last token left in the loss; a reply
    without a repeat, and the prompt, are as they were."""
    from eaglespec.train.data import cut_loops

    prompt, loop, user = [1, 2, 3], [10, 11, 12, 13] + [20, 21, 22] * 4 + [99], [4, 5]
    fine = [30, 31, 32, 33, 34]
    ids = torch.tensor(prompt + fine + user + loop)
    mask = torch.tensor([False] * 3 + [True] * 5 + [False] * 2 + [True] * len(loop))
    got, cut, removed = cut_loops(Example(ids, mask), 3)
    # the loop reply: (20, 21, 22) comes again at its 8th token: those 3 stay, the 7 after them leave
    assert (cut, removed) == (1, len(loop) - 10)
    assert got.input_ids.tolist() == prompt + fine + user + loop[:10]
    assert got.loss_mask.tolist() == [False] * 3 + [True] * 5 + [False] * 2 + [True] * 10
    again = Example(ids[:10], mask[:10])
    assert cut_loops(again, 3) == (again, 0, 0)  # no repeat: untouched
    assert cut_loops(Example(ids, mask), 4)[1:] == (1, len(loop) - 11)  # (20, 21, 22, 20) comes again at its 8th: 4 stay


def test_a_capture_made_before_an_option_existed_resumes_with_its_default(target, tmp_path):
    """An option added to CaptureConfig after a capture was started (loop_cut) reads as its default
    in that capture's manifest: the same command resumes it; another value is refused."""
    examples = synthetic_examples()
    with pytest.raises(Interrupted):
        capture(FailingTarget(target, calls=3), CONFIG, tmp_path, examples=examples, progress=False)
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    del manifest["options"]["loop_cut"]
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(EagleError, match="other options \\(loop_cut\\)"):
        capture(target, CaptureConfig(data="synthetic", shard_size=2, loop_cut=16), tmp_path, examples=examples,
                progress=False)
    assert capture(target, CONFIG, tmp_path, examples=examples, progress=False)["examples"] == 7
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    (tmp_path / MANIFEST).write_text(json.dumps({**manifest, "complete": False,
                                                 "options": {**manifest["options"], "newer": 1}}))
    with pytest.raises(EagleError, match="other options \\(newer\\)"):  # one this version does not know
        capture(target, CONFIG, tmp_path, examples=examples, progress=False)
    with pytest.raises(EagleError, match="--loop-cut 0 \\(off\\) or a stretch of 2"):
        CaptureConfig(loop_cut=1)


def test_capture_cuts_the_loops_of_given_examples_too(target, tmp_path):
    loop = torch.tensor([1, 2, 3] + [20, 21, 22] * 4)
    mask = torch.tensor([False] * 3 + [True] * 12)
    manifest = capture(target, CaptureConfig(data="synthetic", loop_cut=3), tmp_path, examples=[Example(loop, mask)],
                       progress=False)
    ids, kept = FeatureDataset(tmp_path).tokens(0)
    assert manifest["tokens"] == 9 and ids.tolist() == loop[:9].tolist() and kept.tolist() == mask[:9].tolist()
