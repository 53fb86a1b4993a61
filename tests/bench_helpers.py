"""Helpers for the bench tests: a tiny word-level tokenizer with a chat template (built in-process,
no network) so the harness runs end to end on tiny random models, and a deliberately wrong method."""

from __future__ import annotations

import torch

from eaglespec.bench.metrics import Record
from eaglespec.draft.head import EagleHead

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "<user>", "<assistant>"]  # ids 0..5; the tiny configs use eos 2
CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")


def tiny_tokenizer(vocab_size: int = 128):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS)}
    vocab.update({f"w{i}": i for i in range(len(SPECIALS), vocab_size)})
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                  pad_token="<pad>", additional_special_tokens=["<user>", "<assistant>"])
    tok.chat_template = CHAT_TEMPLATE
    return tok


def tiny_generator(arch: str = "llama", tree: str = "eagle1"):
    """An EagleGenerator over a tiny random model, a random head and the tiny tokenizer."""
    from conftest import tiny_target

    from eaglespec.engine.decoding import EagleGenerator

    target = tiny_target(arch)
    target.tokenizer = tiny_tokenizer(target.vocab_size)
    torch.manual_seed(1)
    return EagleGenerator(target, EagleHead(target.config).to(target.dtype), tree)


def words(*ids: int) -> str:
    return " ".join(f"w{i}" for i in ids)


class AlteredMethod:
    """Runs another method, then changes one output token: a method that is NOT lossless."""

    greedy_only = False
    depth = 0

    def __init__(self, inner, vocab_size: int, name: str = "broken", kind: str = "lossless"):
        self.inner, self.vocab_size, self.name, self.kind = inner, vocab_size, name, kind
        self.spec = f"{inner.name} with one token changed"

    def run(self, input_ids, max_new_tokens, sampling) -> Record:
        r = self.inner.run(input_ids, max_new_tokens, sampling)
        ids = list(r.token_ids)
        i = len(ids) // 2
        ids[i] = (ids[i] + 1) % self.vocab_size
        return Record(ids, r.elapsed, r.accepted, r.emitted, r.tree_sizes)


class CountingMethod:
    """Runs another method and counts the calls; raises KeyboardInterrupt on call `interrupt_at`
    (1-based), as a user's Ctrl-C would."""

    def __init__(self, inner, interrupt_at: int | None = None):
        self.inner, self.interrupt_at, self.calls = inner, interrupt_at, 0
        self.name, self.kind, self.spec, self.depth = inner.name, inner.kind, inner.spec, inner.depth
        self.greedy_only = inner.greedy_only

    def run(self, input_ids, max_new_tokens, sampling) -> Record:
        self.calls += 1
        if self.calls == self.interrupt_at:
            raise KeyboardInterrupt
        return self.inner.run(input_ids, max_new_tokens, sampling)
