"""Incremental detokenisation with stop strings: tokens in, printable text deltas out.

Pure Python over a `decode(ids) -> str` function, shared by the server and `eaglespec chat`.
"""

from __future__ import annotations

from typing import Callable, Sequence


class TextStream:
    """Feed accepted tokens with `push`; it returns the text that is safe to show. Text that may be
    the start of a stop string, or an incomplete UTF-8 character, is held back until it is settled.
    A stop string ends the text (it is cut, with everything after it: OpenAI's semantics).

    Decoding is incremental (the scheme of vLLM's and TGI's detokenizers): the new ids are decoded
    together with the few before them (from `_context` on) and only the text past those is added,
    so a step decodes a window of a few tokens at token 5 and at token 5,000 (a whole-prefix
    decode per step made a long reply quadratic). The ids before the new ones give the new text
    its leading spaces and complete its multi-byte characters as a whole decode would; tests/test_text.py checks the
    result against whole decodes on the real tokenizer. With `token_ends`, `push` also records
    where each pushed token's text ends (`ends`), for the server's token-origin extension."""

    def __init__(self, decode: Callable[[list[int]], str], stop: Sequence[str] = (), token_ends: bool = False):
        self.decode = decode
        self.stop = [s for s in stop if s]
        self.ids: list[int] = []
        self.text = ""       # the settled text so far (cut at a stop string once one is seen)
        self.sent = 0        # characters of `text` already returned
        self.stopped = False  # a stop string was seen
        self.token_ends = token_ends
        self.ends: list[int] = []  # with token_ends: per token of the last push, len(text decoded up to it)
        self._full = ""      # the decoded text of ids[:_done] (not cut, nothing held)
        self._done = 0       # ids whose text is in _full
        self._context = 0    # ids[_context:_done] are decoded again before new ones

    def _upto(self, j: int, head: int) -> str:
        """The text of ids[:j] (j >= _done), decoded from the context on; may end in U+FFFD.
        head: len(self._head())."""
        if j == self._done:
            return self._full
        return self._full + self.decode(self.ids[self._context:j])[head:]

    def _head(self) -> str:
        """The text of the context ids, ids[_context:_done], decoded alone."""
        return self.decode(self.ids[self._context:self._done]) if self._context < self._done else ""

    def push(self, tokens: list[int]) -> str:
        if self.stopped:
            self.ends = []
            return ""
        start = len(self.ids)
        self.ids.extend(tokens)
        head = len(self._head())
        if self.token_ends:  # an incomplete UTF-8 character belongs to the token that completes it
            self.ends = [len(self._upto(j, head).rstrip("\ufffd")) for j in range(start + 1, len(self.ids) + 1)]
        text = self._upto(len(self.ids), head)
        incomplete = text.endswith("\ufffd")  # a multi-byte character is still incomplete: held back
        if not incomplete and len(text) > len(self._full):  # new text: the ids so far become the next push's context
            self._full, self._context, self._done = text, self._done, len(self.ids)
        settled = text.rstrip("\ufffd")  # a stop string in the settled text ends it now, this step
        if self._stop_at(settled) or incomplete:
            return self._take(len(self.text)) if self.stopped else ""
        self.text = text
        return self._take(len(text) - _held(text, self.stop))

    def flush(self) -> str:
        """The held-back rest, at the end of generation (`push` has searched its settled text)."""
        if not self.stopped:
            self.text = self._upto(len(self.ids), len(self._head()))
        return self._take(len(self.text))

    def _stop_at(self, text: str) -> bool:
        """Whether `text` holds a stop string; if so the text ends where the first one begins."""
        cut = min((i for i in (text.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped, self.text = True, text[:cut]
        return cut >= 0

    def _take(self, end: int) -> str:
        end = max(end, self.sent)
        delta = self.text[self.sent:end]
        self.sent = end
        return delta


def _held(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best
