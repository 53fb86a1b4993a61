"""Self-distilled data on a tiny random float64 model with a ChatML tokenizer: batched replies equal
one-conversation-at-a-time greedy decoding, resumption, refusals, and `--data DIR` for training."""

import json
from dataclasses import replace

import pytest
import torch

from conftest import paused_for_a_while, tiny_model
from eaglespec.engine.target import TargetModel
from eaglespec.errors import EagleError
from eaglespec.train.config import DataConfig, DistillConfig
from eaglespec.train.data import DataSummary, iter_examples, read_records, render, source_digest
from eaglespec.train.distill import MANIFEST, distill, prompt_ids
from tiny_tokenizer import tiny_tokenizer

EOS = 2  # <|im_end|>


class Interrupted(Exception):
    """As by Ctrl-C or a crash."""


def make_target(seed=0):
    tok = tiny_tokenizer()
    model = tiny_model("llama", seed, vocab_size=len(tok))
    # generate() would apply these from the model's generation_config; distill must switch them off
    model.generation_config.repetition_penalty = 1.5
    model.generation_config.top_k = 3
    with torch.no_grad():  # end about half the replies before --max-new-tokens
        model.get_output_embeddings().weight[EOS] *= 2.0
    return TargetModel(model, tokenizer=tok, name=f"tiny-chat-{seed}")


@pytest.fixture(scope="module")
def target():
    return make_target()


def chat_file(path, n=7):
    """n conversations of 1-2 exchanges whose prompts differ in length (rows get left padding),
    plus one without an assistant turn; some have a system turn or end with a user turn."""
    rows = []
    for i in range(n):
        turns = [{"from": "system", "value": "Be brief."}] if i % 3 == 0 else []
        turns += [{"from": "human", "value": "Say " + "abcdefgh"[: 1 + i]}, {"from": "gpt", "value": "old reply"}]
        if i % 2:
            turns += [{"from": "human", "value": f"More {i}?"}, {"from": "gpt", "value": "another old reply"}]
        if i == 4:
            turns.append({"from": "human", "value": "unanswered"})
        rows.append({"conversations": turns})
    rows.insert(2, {"conversations": [{"from": "human", "value": "hello?"}]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def greedy_reply(target, messages, max_new_tokens):
    """Reference: one conversation, plain full forwards, argmax (no generate(), no padding, no cache)."""
    text = target.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = target.tokenizer(text, add_special_tokens=False)["input_ids"]
    new = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            token = int(target.model(input_ids=torch.tensor([ids + new])).logits[0, -1].argmax())
            if token == EOS:
                break
            new.append(token)
    return target.tokenizer.decode(new, skip_special_tokens=True)


def reference(target, source_messages, max_new_tokens):
    out = []
    for message in source_messages:
        if message["role"] == "assistant":
            message = {"role": "assistant", "content": greedy_reply(target, out, max_new_tokens)}
        out.append(message)
    return out


def records(directory):
    return [r for f in sorted(directory.glob("chunk-*.jsonl")) for r in map(json.loads, f.read_text().splitlines())]


def generate_spy(target, rows):
    """target.model.generate that appends each call's prompt count to `rows`; with limit=N it raises
    Interrupted instead of generating past N prompts in all."""
    real = target.model.generate

    def spy(*args, limit=None, **kwargs):
        if limit is not None and sum(rows) + len(kwargs["input_ids"]) > limit:
            raise Interrupted
        rows.append(len(kwargs["input_ids"]))
        return real(*args, **kwargs)
    return spy


def files(directory):
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_batched_replies_equal_one_conversation_at_a_time_greedy(target, tmp_path):
    data = chat_file(tmp_path / "chats.jsonl")
    config = DistillConfig(data=str(data), max_new_tokens=12, batch_size=4, chunk_size=3, max_length=256)
    manifest = distill(target, config, tmp_path / "out", progress=False)
    assert manifest["complete"] and manifest["total"] == 7 and manifest["records"] == 7
    assert [c["conversations"] for c in manifest["chunks"]] == [3, 3, 1]
    assert manifest["summary"]["skipped_no_assistant"] == 1 and manifest["target"] == target.identity()
    assert manifest["replies"] == 7 + 3 and manifest["eos_token_ids"] == [EOS]
    assert 0 < manifest["cut_replies"] < manifest["replies"]  # rows of a batch stop at EOS at different steps

    got = records(tmp_path / "out")
    source, _ = read_records(str(data))
    source = [r["conversations"] for r in source if len(r["conversations"]) > 1]
    assert len(got) == len(source) == 7
    for record, turns in zip(got, source):
        messages = [{"role": {"human": "user", "gpt": "assistant"}.get(t["from"], t["from"]), "content": t["value"]}
                    for t in turns]
        if messages[-1]["role"] == "user":  # nothing answers it: the record ends with the last reply
            messages = messages[:-1]
        assert record == {"messages": reference(target, messages, 12)}
    replies = [m["content"] for r in got for m in r["messages"] if m["role"] == "assistant"]
    assert not any(r in ("old reply", "another old reply") for r in replies)
    assert sum(len(r) > 1 for r in replies) >= 3  # real replies, not only instant EOS


def test_resume_writes_the_same_files_and_refusals_change_nothing(target, tmp_path, monkeypatch):
    data = chat_file(tmp_path / "chats.jsonl")
    config = DistillConfig(data=str(data), max_new_tokens=8, temperature=0.9, seed=3, batch_size=2, chunk_size=2,
                           max_length=256)
    whole = distill(target, config, tmp_path / "whole", progress=False)
    assert len(whole["chunks"]) == 4

    rows = []  # prompts generated, per generate() call
    spy = generate_spy(target, rows)

    first_two = sum(c["replies"] for c in whole["chunks"][:2])
    monkeypatch.setattr(target.model, "generate", lambda *a, **k: spy(*a, limit=first_two, **k))
    with pytest.raises(Interrupted):  # in chunk 2, after chunks 0 and 1 were committed
        distill(target, config, tmp_path / "cut", progress=False)
    monkeypatch.setattr(target.model, "generate", lambda *a, **k: spy(*a, **k))
    manifest = json.loads((tmp_path / "cut" / MANIFEST).read_text())
    assert (manifest["complete"], len(manifest["chunks"]), manifest["conversations"]) == (False, 2, 4)
    with pytest.raises(EagleError, match="incomplete \\(4 of 7 conversations\\).*rerun the same eaglespec distill"):
        read_records(str(tmp_path / "cut"))

    before = files(tmp_path / "cut")
    other = make_target(seed=1)
    missing = replace(config, data=str(tmp_path / "missing.jsonl"))
    refusals = [
        (other, config, "made for target .*fingerprint"),
        (target, replace(config, max_new_tokens=9), "other options \\(max_new_tokens\\)"),
        (target, missing, "other options \\(data\\)"),
    ]
    for who, cfg, problem in refusals:
        with pytest.raises(EagleError, match=problem):
            distill(who, cfg, tmp_path / "cut", progress=False)
    with pytest.raises(EagleError, match="not found"):  # a wrong --data loses nothing, even with --overwrite
        distill(target, missing, tmp_path / "cut", overwrite=True, progress=False)
    changed = data.read_text()
    data.write_text(changed.replace("Say a", "Say z"))
    with pytest.raises(EagleError, match="changed since .* SHA-256"):
        distill(target, config, tmp_path / "cut", progress=False)
    data.write_text(changed)
    assert files(tmp_path / "cut") == before

    # the rerun generates only the replies of chunks 2-3, then the files equal the uninterrupted run's
    rows.clear()
    distill(target, config, tmp_path / "cut", progress=False)
    assert sum(rows) == whole["replies"] - first_two
    assert files(tmp_path / "cut") == files(tmp_path / "whole")


def test_another_max_examples_extends_a_run_or_ends_it_sooner(target, tmp_path, monkeypatch):
    data = chat_file(tmp_path / "chats.jsonl")
    config = DistillConfig(data=str(data), max_new_tokens=8, temperature=0.9, seed=3, batch_size=2, chunk_size=2,
                           max_length=256)
    runs = {n: distill(target, replace(config, max_examples=n), tmp_path / f"run{n}", progress=False)
            for n in (2, 3, 4, 5)}
    whole = distill(target, config, tmp_path / "whole", progress=False)
    small = distill(target, replace(config, max_examples=3), tmp_path / "grown", progress=False)
    assert (small["complete"], small["conversations"], len(small["chunks"])) == (True, 3, 2)

    rows = []
    spy = generate_spy(target, rows)

    monkeypatch.setattr(target.model, "generate", lambda *a, **k: spy(*a, **k))
    distill(target, replace(config, max_examples=4), tmp_path / "grown", progress=False)
    assert sum(rows) == sum(c["replies"] for c in whole["chunks"][1:2])  # chunk 1 again, now with 2 conversations
    assert files(tmp_path / "grown") == files(tmp_path / "run4")
    rows.clear()
    grown = distill(target, config, tmp_path / "grown", progress=False)  # all of them
    assert sum(rows) == sum(c["replies"] for c in whole["chunks"][2:])  # the full chunks 0 and 1 were kept
    assert grown == whole and files(tmp_path / "grown") == files(tmp_path / "whole")

    # refused when full chunks would go (7 = 2+2+2+1: 5 keeps only 4), and nothing changes
    before = files(tmp_path / "whole")
    with pytest.raises(EagleError, match="holds 6 conversations in full chunks: --max-examples 5 would drop some"):
        distill(target, replace(config, max_examples=5), tmp_path / "whole", progress=False)
    assert files(tmp_path / "whole") == before

    # an unfinished run of all 7, stopped after its first two chunks, ends sooner at 5
    first_two = sum(c["replies"] for c in whole["chunks"][:2])
    rows.clear()
    monkeypatch.setattr(target.model, "generate", lambda *a, **k: spy(*a, limit=first_two, **k))
    with pytest.raises(Interrupted):
        distill(target, config, tmp_path / "cut", progress=False)
    monkeypatch.setattr(target.model, "generate", lambda *a, **k: spy(*a, **k))
    assert distill(target, replace(config, max_examples=5), tmp_path / "cut", progress=False) == runs[5]
    assert files(tmp_path / "cut") == files(tmp_path / "run5")

    # fewer from a finished run: its partial last chunk goes, its file too, even when the run that
    # dropped it stopped right after writing the manifest
    import eaglespec.train.distill as module
    real_write = module._write_manifest

    def write_then_stop(directory, manifest):
        real_write(directory, manifest)
        raise Interrupted

    monkeypatch.setattr(module, "_write_manifest", write_then_stop)
    with pytest.raises(Interrupted):
        distill(target, replace(config, max_examples=2), tmp_path / "run3", progress=False)
    monkeypatch.setattr(module, "_write_manifest", real_write)
    assert (tmp_path / "run3" / "chunk-00001.jsonl").exists()
    rows.clear()
    assert distill(target, replace(config, max_examples=2), tmp_path / "run3", progress=False) == runs[2]
    assert rows == [] and files(tmp_path / "run3") == files(tmp_path / "run2")


def test_other_folders_are_refused_and_overwrite_starts_again(target, tmp_path):
    data = chat_file(tmp_path / "chats.jsonl", n=2)
    config = DistillConfig(data=str(data), max_new_tokens=4, max_length=256)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("mine")
    (tmp_path / "capture").mkdir()
    (tmp_path / "capture" / MANIFEST).write_text(json.dumps({"format": "eaglespec-capture/1"}))
    refused = {"notes": "not empty and holds no distill run", "capture": "format 'eaglespec-capture/1'"}
    for folder, problem in refused.items():
        before = files(tmp_path / folder)
        for overwrite in (False, True):
            with pytest.raises(EagleError, match=problem):
                distill(target, config, tmp_path / folder, overwrite=overwrite, progress=False)
        assert files(tmp_path / folder) == before
    with pytest.raises(EagleError, match="no manifest.json.*not written by eaglespec distill"):
        read_records(str(tmp_path / "notes"))

    first = distill(target, config, tmp_path / "out", progress=False)
    assert distill(target, config, tmp_path / "out", progress=False) == first  # complete: nothing to do
    again = DistillConfig(data=str(data), max_new_tokens=6, max_length=256, chunk_size=1)
    manifest = distill(target, again, tmp_path / "out", overwrite=True, progress=False)
    assert manifest["options"]["max_new_tokens"] == 6 and len(manifest["chunks"]) == 2
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["chunk-00000.jsonl", "chunk-00001.jsonl", MANIFEST]


def test_max_turns_and_prompts_longer_than_max_length(target, tmp_path):
    data = chat_file(tmp_path / "chats.jsonl", n=4)  # conversations 1 and 3 have two exchanges
    one = distill(target, DistillConfig(data=str(data), max_new_tokens=4, max_turns=1, max_length=256),
                  tmp_path / "one", progress=False)
    assert one["replies"] == 4 and all(r["messages"][-1]["role"] == "assistant" and
                                       sum(m["role"] == "assistant" for m in r["messages"]) == 1
                                       for r in records(tmp_path / "one"))
    # a --max-length that fits every first prompt but no second one: those conversations end early
    source = [r["messages"] for r in records(tmp_path / "one")]
    first = max(len(prompt_ids(target.tokenizer, m[:-1])) for m in source)
    second = min(len(prompt_ids(target.tokenizer, [*m, {"role": "user", "content": f"More {i}?"}]))
                 for i, m in enumerate(source) if i % 2)
    assert first < second
    cut = distill(target, DistillConfig(data=str(data), max_new_tokens=4, max_length=first), tmp_path / "cut",
                  progress=False)
    assert (cut["records"], cut["replies"], cut["ended_early"], cut["dropped"]) == (4, 4, 2, 0)
    assert records(tmp_path / "cut") == records(tmp_path / "one")
    skip = distill(target, DistillConfig(data=str(data), max_new_tokens=4, max_length=first, overflow="skip"),
                   tmp_path / "skip", progress=False)
    assert (skip["records"], skip["dropped"]) == (2, 2)
    with pytest.raises(EagleError, match="no usable conversation.*4 too long"):
        distill(target, DistillConfig(data=str(data), max_length=8, max_new_tokens=4), tmp_path / "none",
                progress=False)
    assert not (tmp_path / "none").exists()


def test_a_distill_directory_is_training_data(target, tmp_path):
    data = chat_file(tmp_path / "chats.jsonl", n=5)
    out = tmp_path / "out"
    distill(target, DistillConfig(data=str(data), max_new_tokens=6, chunk_size=2, max_length=256), out, progress=False)
    summary = DataSummary()
    examples = list(iter_examples(target.tokenizer, DataConfig(data=str(out), max_length=256), summary))
    got = records(out)
    assert len(examples) == summary.examples == len(got) == 5
    for example, record in zip(examples, got):
        expected = render(record["messages"], target.tokenizer)
        assert torch.equal(example.input_ids, expected.input_ids) and torch.equal(example.loss_mask, expected.loss_mask)
    digest = source_digest(str(out))
    chunk = out / "chunk-00001.jsonl"
    chunk.write_text(chunk.read_text().replace('"user"', '"human"', 1))
    assert source_digest(str(out)) != digest
    chunk.unlink()
    with pytest.raises(EagleError, match="chunk-00001.jsonl is missing"):
        read_records(str(out))


def test_command(target, tmp_path, monkeypatch, capsys):
    from eaglespec.cli import commands
    from eaglespec.train import cli as train_cli

    monkeypatch.setattr(train_cli, "_load_target", lambda args: target)
    data = chat_file(tmp_path / "chats.jsonl", n=3)
    argv = ["distill", "--data", str(data), "--out", str(tmp_path / "out"), "--max-new-tokens", "4",
            "--max-length", "256", "--max-turns", "1"]
    assert commands.main(argv) == 0
    printed = capsys.readouterr()
    assert "distilled 3 conversations (3 replies" in printed.out and "3/3" in printed.err  # the progress bar
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())
    assert manifest["options"] == {**DistillConfig().__dict__, "data": str(data), "max_new_tokens": 4,
                                   "max_length": 256, "max_turns": 1}
    assert commands.main([*argv[:-1], "5", "--no-progress"]) == 2  # other --max-turns: refused
    assert "other options (max_turns)" in capsys.readouterr().err


def test_sampling_is_seeded_per_chunk(target, tmp_path):
    data = tmp_path / "same.jsonl"  # one conversation four times, one chunk each
    line = json.dumps({"messages": [{"role": "user", "content": "Say abc"}, {"role": "assistant", "content": "x"}]})
    data.write_text((line + "\n") * 4)

    def replies(out, **options):
        config = DistillConfig(data=str(data), max_new_tokens=8, chunk_size=1, max_length=256, **options)
        distill(target, config, tmp_path / out, progress=False)
        return [r["messages"][-1]["content"] for r in records(tmp_path / out)]

    assert len(set(replies("greedy"))) == 1
    sampled = replies("sampled", temperature=1.0, seed=5)
    assert len(set(sampled)) > 1 and sampled == replies("again", temperature=1.0, seed=5)
    assert sampled != replies("other-seed", temperature=1.0, seed=6)


def test_a_pause_file_holds_the_run_between_batches(target, tmp_path, monkeypatch):
    """A PAUSE file in --out (or a running benchmark) stops generation at the next batch until it goes."""
    import eaglespec.train.distill as module

    out = tmp_path / "out"
    out.mkdir()
    batches = []
    original = module.generate
    monkeypatch.setattr(module, "generate", lambda *a, **k: batches.append(1) or original(*a, **k))
    config = DistillConfig(data=str(chat_file(tmp_path / "chats.jsonl")), max_new_tokens=4, batch_size=4,
                           chunk_size=3, max_length=256)
    with paused_for_a_while(out, batches, monkeypatch) as seen_paused:
        manifest = distill(target, config, out, progress=False)
    assert seen_paused.is_set() and manifest["complete"] and manifest["records"] == 7 and batches


def test_a_pause_point_follows_every_generated_token(target, tmp_path, monkeypatch):
    """wait() runs before each batch and after each of its tokens: a benchmark waits for a token, not
    for a batch of 256-token replies (which outlasted its 30 s wait for jobs beside other work)."""
    from eaglespec.train.distill import distill_chunk, stops

    steps = []  # per batch: the tokens generated (generate's output past the prompt)
    real = target.model.generate

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        steps.append(out.shape[1] - kwargs["input_ids"].shape[1])
        return out
    monkeypatch.setattr(target.model, "generate", spy)
    waits = []
    config = DistillConfig(max_new_tokens=6, batch_size=2, max_length=256, max_turns=1)
    chats = [[{"role": "user", "content": "Say " + "abcdefgh"[:1 + i]}, {"role": "assistant", "content": "old"}]
             for i in range(5)]
    counts = dict.fromkeys(("replies", "new_tokens", "cut_replies", "conversations", "ended_early", "dropped",
                            "records"), 0)
    distill_chunk(target, chats, config, stops(target), (0,), counts, wait=lambda: waits.append(1) or 0.0)
    assert len(steps) >= 2 and counts["new_tokens"] > 0
    assert len(waits) == len(steps) + sum(steps)


def test_a_run_written_before_a_summary_counter_existed_resumes_and_grows(target, tmp_path, monkeypatch):
    """A manifest whose data summary lacks counters added since (loops_cut, loop_tokens) reads them
    as 0: an interrupted run resumes, a finished one grows, and the files equal one run's."""
    data = chat_file(tmp_path / "chats.jsonl")
    config = DistillConfig(data=str(data), max_new_tokens=8, batch_size=2, chunk_size=2, max_length=256)
    whole = distill(target, config, tmp_path / "whole", progress=False)

    def predate(folder):
        manifest = json.loads((folder / MANIFEST).read_text())
        for key in ("loops_cut", "loop_tokens"):
            del manifest["summary"][key]
        (folder / MANIFEST).write_text(json.dumps(manifest))

    spy = generate_spy(target, [])
    monkeypatch.setattr(target.model, "generate", lambda *a, **k: spy(*a, limit=whole["chunks"][0]["replies"], **k))
    with pytest.raises(Interrupted):
        distill(target, config, tmp_path / "cut", progress=False)
    monkeypatch.setattr(target.model, "generate", lambda *a, **k: spy(*a, **k))
    predate(tmp_path / "cut")
    distill(target, config, tmp_path / "cut", progress=False)
    assert files(tmp_path / "cut") == files(tmp_path / "whole")
    distill(target, replace(config, max_examples=4), tmp_path / "grown", progress=False)
    predate(tmp_path / "grown")
    distill(target, config, tmp_path / "grown", progress=False)
    assert files(tmp_path / "grown") == files(tmp_path / "whole")
