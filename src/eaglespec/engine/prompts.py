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
COUNT_CHUNK_CHARS = 16384  # tokens_at_least: text counted this many characters at a time (~10-30 ms each)
CUT_SLACK = 64  # tokens_at_least: the most one cut between chunks may add to their summed counts


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
    """An upper bound on the UTF-8 bytes of text one token stands for: the longest vocabulary entry
    (entries spell their text with at least as many bytes: byte-level BPE's `Ġ`, SentencePiece's
    `▁`, byte-fallback `<0xE3>`), times BYTES_SLACK when the tokenizer normalises its input (which
    can shrink it). A text longer than `max_token_bytes(tok) * n` bytes cannot fit in n tokens."""
    backend = getattr(tok, "backend_tokenizer", None)
    slack = 1 if backend is not None and backend.normalizer is None else BYTES_SLACK
    return slack * max(len(t.encode("utf-8", "surrogatepass")) for t in tok.get_vocab())


def prompt_text(tok, messages: list[dict], chat_template: bool = True) -> str:
    """The text `EagleGenerator.encode` tokenizes for these messages: the chat template rendered
    (its special tokens as text), else the contents joined by newlines."""
    if chat_template and tok.chat_template:
        return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return "\n".join(m["content"] for m in messages)


def tokens_at_least(tok, text: str, limit: int, parse_special: bool = False) -> int:
    """A lower bound on the tokens `text` encodes to, found without tokenizing more of it than
    about `limit` tokens take: the text is tokenized COUNT_CHUNK_CHARS characters at a time, cut
    before a space where there is one, and counting stops as soon as the bound passes `limit`.

    The bound is the chunks' summed counts less CUT_SLACK per cut (a cut can split a token, or a
    pre-tokenizer's word, in two: a few tokens more than the whole text gives), never above the
    exact count; a text of one chunk is counted exactly. `parse_special`: special-token strings
    count as one token each (as a rendered chat template's do), else as the text they spell."""
    total, cuts, start = 0, 0, 0
    while start < len(text):
        end = _cut(text, start + COUNT_CHUNK_CHARS)
        total += len(tok(text[start:end], add_special_tokens=False, split_special_tokens=not parse_special,
                         return_attention_mask=False)["input_ids"])
        cuts += end < len(text)
        start = end
        if total - CUT_SLACK * cuts > limit:
            break
    return max(total - CUT_SLACK * cuts, 0)


def _cut(text: str, end: int) -> int:
    """Where to end a chunk at about `end`: before a space that follows a non-space (a word
    boundary for byte-level BPE and SentencePiece pre-tokenizers) within the last eighth of
    the chunk, else at `end` itself."""
    if end >= len(text):
        return len(text)
    i = text.rfind(" ", end - COUNT_CHUNK_CHARS // 8, end)
    while i > 0 and text[i - 1].isspace():
        i -= 1
    return i if i > end - COUNT_CHUNK_CHARS // 8 else end


def _special_pattern(tok) -> re.Pattern | None:
    """The special tokens a tokenizer would parse out of text, longest first."""
    specials = {t.content for t in tok.added_tokens_decoder.values() if t.special} | set(tok.all_special_tokens)
    specials = sorted((s for s in specials if s), key=len, reverse=True)
    return re.compile("|".join(map(re.escape, specials))) if specials else None
