"""A tiny byte-level tokenizer built in-process (no network): one token per printable ASCII
character plus ChatML-like special tokens, 103 ids in all, so it fits the tiny test models'
vocabulary of 128."""

from __future__ import annotations

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<pad>", "<s>", "<|im_end|>", "<unk>", "<|im_start|>"]  # <|im_end|> = 2 = the tiny models' eos


def tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    # Printable ASCII maps to itself in the byte-level alphabet; space, newline and tab to Ġ, Ċ, ĉ.
    chars = [chr(c) for c in range(0x21, 0x7F)] + ["Ġ", "Ċ", "ĉ"]
    assert all(c in alphabet for c in chars)
    vocab = {t: i for i, t in enumerate(SPECIALS + chars)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="<|im_end|>", unk_token="<unk>", pad_token="<pad>",
        additional_special_tokens=["<|im_start|>"], chat_template=CHAT_TEMPLATE,
    )


def tiny_chat_generator(arch: str = "llama", seed: int = 0, tree: str = "eagle1"):
    """An EagleGenerator over a tiny random target that has this tokenizer, and a random head."""
    import torch
    from conftest import tiny_model

    from eaglespec.draft.head import EagleHead
    from eaglespec.engine.decoding import EagleGenerator
    from eaglespec.engine.target import TargetModel

    tok = tiny_tokenizer()
    target = TargetModel(tiny_model(arch, seed, vocab_size=len(tok)), tokenizer=tok, name=f"tiny-{arch}")
    torch.manual_seed(seed)
    return EagleGenerator(target, head=EagleHead(target.config).to(target.dtype), tree=tree)
