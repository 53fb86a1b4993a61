"""TextStream's incremental decoding gives what decoding the whole prefix at every step gives
(the algorithm it replaced, kept here as the reference): the same deltas, the same stop-string
cuts, the same held-back text, and the same per-token text ends, on SmolLM2's real tokenizer
(byte-level BPE: multi-byte characters split over tokens, leading spaces) and on the tests' tiny
one, for replies pushed in steps of 1 to 5 tokens."""

from __future__ import annotations

import random

import pytest

from eaglespec.engine.text import TextStream, _held

TEXTS = (
    "Sure! Here is a short poem about rivers:\n\nThe river runs, the river bends, 🌊 and where it ends...",
    "日本語のテキスト、そして emoji 😀👍🏽 mixed with English; naïve café résumé — “quotes”.",
    "def f(x):\n    return x ** 2  # squares\n\n```python\nprint(f(3))\n```\nDone. STOP here, then more.",
)
STOPS = ((), ("STOP",), ("\n\n",), ("ends", "🌊"), ("。", "mixed"), ("```",))


class WholeDecode:
    """The reference: the old TextStream, decoding every id so far at each push."""

    def __init__(self, decode, stop=()):
        self.decode, self.stop = decode, [s for s in stop if s]
        self.ids, self.text, self.sent, self.stopped = [], "", 0, False

    def push(self, tokens):
        if self.stopped:
            return ""
        self.ids.extend(tokens)
        text = self.decode(self.ids)
        settled = text.rstrip("\ufffd")  # a stop string in the settled text counts at once
        cut = min((i for i in (settled.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped, self.text = True, settled[:cut]
            return self._take(cut)
        if text.endswith("\ufffd"):
            return ""
        self.text = text
        return self._take(len(text) - _held(text, self.stop))

    def flush(self):
        if not self.stopped:
            self.text = self.decode(self.ids)
        return self._take(len(self.text))

    def _take(self, end):
        end = max(end, self.sent)
        delta, self.sent = self.text[self.sent:end], end
        return delta


def _check(tok, ids: list[int], stop, seed: int) -> None:
    def decode(x):
        return tok.decode(x, skip_special_tokens=True)

    rng = random.Random(seed)
    ours, ref = TextStream(decode, stop, token_ends=True), WholeDecode(decode, stop)
    i = 0
    while i < len(ids) and not ours.stopped:
        step = ids[i:i + rng.randint(1, 5)]
        got, want = ours.push(step), ref.push(step)
        assert got == want, f"delta at id {i}: {got!r} != {want!r}"
        assert ours.ends == [len(decode(ids[:j]).rstrip("\ufffd")) for j in range(i + 1, i + len(step) + 1)]
        i += len(step)
    assert ours.flush() == ref.flush()
    assert ours.text == ref.text and ours.stopped == ref.stopped


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from transformers import AutoTokenizer

    from eaglespec.engine.target import default_gguf_path

    gguf = default_gguf_path()
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


@pytest.mark.parametrize("stop", STOPS)
def test_incremental_text_is_the_whole_decode_on_smollm2(smollm2_tokenizer, stop):
    tok = smollm2_tokenizer
    for n, text in enumerate(TEXTS):
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text  # the tokenizer round-trips these texts
        _check(tok, ids, stop, seed=n)
    rng = random.Random(1)  # ids that are no text at all: byte pieces that never complete, specials
    for n in range(20):
        _check(tok, [rng.randrange(tok.vocab_size) for _ in range(rng.randint(1, 60))], stop, seed=n)


def test_incremental_text_is_the_whole_decode_on_the_tiny_tokenizer():
    from tiny_tokenizer import tiny_tokenizer

    tok = tiny_tokenizer()
    rng = random.Random(2)
    for n in range(30):
        ids = [rng.randrange(len(tok)) for _ in range(rng.randint(1, 80))]
        _check(tok, ids, STOPS[n % len(STOPS)] + ("ab",), seed=n)


def _bytes_decode(pieces: list[bytes]):
    """A byte-level tokenizer's decode over the ids 0..len(pieces)-1."""
    return lambda ids: b"".join(pieces[i] for i in ids).decode("utf-8", errors="replace")


def test_a_stop_string_before_an_incomplete_character_ends_the_text_at_once():
    """A step whose text ends in the first byte of a multi-byte character, after a stop string:
    the stop counts in that step (it was once found only a step later, and never when that step
    was the last: the stop string went out with the reply)."""
    decode = _bytes_decode([b"Hi", b". Then", b"\xe4", b"\xb8\x80 more"])
    text = TextStream(decode, ["."])
    assert text.push([0, 1, 2]) == "Hi" and text.stopped
    assert text.flush() == "" and text.text == "Hi"
    text = TextStream(decode, ["Then"])
    assert text.push([0]) == "Hi" and text.push([1, 2]) == ". " and text.stopped and text.text == "Hi. "
    unsettled = TextStream(decode, ["\u4e00 m"])  # the stop's first character is not complete yet
    assert unsettled.push([0, 1, 2]) == "" and not unsettled.stopped
    assert unsettled.push([3]) == "Hi. Then" and unsettled.stopped and unsettled.flush() == ""


def _metaspace_tokenizer():
    """SentencePiece's convention (Llama 2, Mistral): a word's space is a leading "▁" that a decode
    drops at the very start, so decoding the new ids alone would lose it: the context keeps it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = ["▁"] + [chr(c) for c in range(0x21, 0x7F)]
    vocab = {t: i for i, t in enumerate(["<unk>", "</s>"] + chars + ["▁" + c for c in "abcdefghij"])}
    merges = [("▁", c) for c in "abcdefghij"]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok.add_special_tokens(["</s>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="</s>")


def test_incremental_text_is_the_whole_decode_with_sentencepiece_spaces():
    tok = _metaspace_tokenizer()
    text = "a big cat, did each fig hide? jab: ice"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text and len(ids) < len(text)  # "▁b" is one id: the space lives in it
    for n, stop in enumerate(STOPS + (("cat",), ("g h",))):
        _check(tok, ids, stop, seed=n)


def test_a_long_reply_decodes_only_a_window_per_step(smollm2_tokenizer):
    """Each push decodes the few ids before the new ones, not the whole reply."""
    tok = smollm2_tokenizer
    ids = tok.encode(" ".join(TEXTS) * 20, add_special_tokens=False)
    widths = []

    def decode(x):
        widths.append(len(x))
        return tok.decode(x, skip_special_tokens=True)

    stream = TextStream(decode)
    out = "".join(stream.push(ids[i:i + 3]) for i in range(0, len(ids), 3)) + stream.flush()
    assert out == tok.decode(ids, skip_special_tokens=True)
    assert len(ids) > 1000 and max(widths[-50:]) < 40, max(widths[-50:])
