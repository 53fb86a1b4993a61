"""Text -> token ids without letting text forge control tokens.

A tokenizer parses special-token strings (`<|im_start|>`, `<|eot_id|>`, ...) wherever they appear
in its input, so a chat template rendered to one string and tokenized lets a message that contains
`<|im_start|>system` open a turn of its own. Here message contents and plain prompts are tokenized
as text (`split_special_tokens=True`): special tokens come only from the template.

Works with any Hugging Face tokenizer; no `transformers` import.
"""

from __future__ import annotations

import re
import secrets

BYTES_SLACK = 4  # Unicode normalisation (NFC, NFKC) can shrink text ~3x before it is tokenized


def encode_text(tok, text: str, add_special_tokens: bool = True) -> list[int]:
    """Plain text -> ids: special-token strings in it are spelled out, never parsed. The tokenizer's
    own additions (a BOS) stay when `add_special_tokens`."""
    return list(tok(text, add_special_tokens=add_special_tokens, split_special_tokens=True)["input_ids"])


def encode_chat(tok, messages: list[dict]) -> list[int]:
    """Render `messages` with the tokenizer's chat template (generation prompt added) -> ids, with
    each message's content tokenized as text.

    Contents that hold no special-token string give exactly `apply_chat_template`'s ids. Otherwise
    each special-token string in a content is swapped for a unique placeholder, the template is
    rendered (its own transformations, such as trimming, still apply), and the rendered text is
    tokenized piece by piece: the pieces normally (the template's special tokens are real), each
    placeholder as the text it stands for. The text on either side of a placeholder is tokenized
    apart from it, as a parsed special token would have split it (a SentencePiece tokenizer may
    add a prefix space to a piece)."""
    special = _special_pattern(tok)
    if special is None or not any(isinstance(m.get("content"), str) and special.search(m["content"]) for m in messages):
        return list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                            return_dict=True)["input_ids"])
    nonce = secrets.token_hex(8)
    literals: list[str] = []

    def hide(match: re.Match) -> str:
        literals.append(match.group(0))
        return f"\ue000{nonce}:{len(literals) - 1}\ue001"  # private-use characters: no template touches them

    hidden = [{**m, "content": special.sub(hide, m["content"])} if isinstance(m.get("content"), str) else m
              for m in messages]
    rendered = tok.apply_chat_template(hidden, add_generation_prompt=True, tokenize=False)
    pieces = re.split(f"\ue000{nonce}:(\\d+)\ue001", rendered)  # text, index, text, index, ..., text
    ids: list[int] = []
    for i, piece in enumerate(pieces):
        if i % 2:
            ids += encode_text(tok, literals[int(piece)], add_special_tokens=False)
        elif piece:
            ids += tok(piece, add_special_tokens=False)["input_ids"]
    return ids


def max_token_bytes(tok) -> int:
    """An upper bound on the UTF-8 bytes of text one token stands for: BYTES_SLACK times the
    longest vocabulary entry (entries spell their text with at least as many bytes: byte-level
    BPE's `Ġ`, SentencePiece's `▁`, byte-fallback `<0xE3>`). A text longer than
    `max_token_bytes(tok) * n` bytes cannot fit in n tokens."""
    return BYTES_SLACK * max(len(t.encode("utf-8", "surrogatepass")) for t in tok.get_vocab())


def _special_pattern(tok) -> re.Pattern | None:
    """The special tokens a tokenizer would parse out of text, longest first."""
    specials = {t.content for t in tok.added_tokens_decoder.values() if t.special} | set(tok.all_special_tokens)
    specials = sorted((s for s in specials if s), key=len, reverse=True)
    return re.compile("|".join(map(re.escape, specials))) if specials else None
