"""Incremental detokenisation with stop strings: tokens in, printable text deltas out.

Pure Python over a `decode(ids) -> str` function, shared by the server and `eaglespec chat`.
"""

from __future__ import annotations

from typing import Callable, Sequence


class TextStream:
    """Feed accepted tokens with `push`; it returns the text that is safe to show. Text that may be
    the start of a stop string, or an incomplete UTF-8 character, is held back until it is settled.
    A stop string ends the text (it is cut, with everything after it: OpenAI's semantics)."""

    def __init__(self, decode: Callable[[list[int]], str], stop: Sequence[str] = ()):
        self.decode = decode
        self.stop = [s for s in stop if s]
        self.ids: list[int] = []
        self.text = ""       # the settled text so far (cut at a stop string once one is seen)
        self.sent = 0        # characters of `text` already returned
        self.stopped = False  # a stop string was seen

    def push(self, tokens: list[int]) -> str:
        if self.stopped:
            return ""
        self.ids.extend(tokens)
        text = self.decode(self.ids)
        if text.endswith("\ufffd"):  # a multi-byte character is still incomplete
            return ""
        cut = min((i for i in (text.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self.text = text[:cut]
            return self._take(cut)
        self.text = text
        return self._take(len(text) - _held(text, self.stop))

    def flush(self) -> str:
        """The held-back rest, at the end of generation."""
        if not self.stopped:
            text = self.decode(self.ids)
            self.text = text
        return self._take(len(self.text))

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
