"""Where each token of a reply came from, for the `token_origin` extension (docs/serving.md).

Per verification step the first `accepted` tokens are draft tokens the target accepted; the one
after them is the target's own: a bonus token (the accepted path reached a leaf of the tree) or a
recovered token (every child of the last accepted node was rejected). A step that verified its
root alone (vanilla decoding, a request with drafting off) and the prefill's token are the
target's too, with no draft to speak of: "target".

`TokenSpans` maps the text a stream sends to the tokens that spell it. Pure Python.
"""

from __future__ import annotations

from ..engine.batch import StepStats

DRAFT, BONUS, RECOVERED, TARGET = "draft", "bonus", "recovered", "target"


def step_origins(stats: StepStats) -> list[str]:
    """The origin of each token one step emitted, in order (a stop token may cut the step short)."""
    drafted = min(stats.accepted, stats.emitted)
    own = TARGET if stats.tree_size <= 1 else BONUS if stats.bonus else RECOVERED
    return [DRAFT] * drafted + [own] * (stats.emitted - drafted)


def step_record(stats: StepStats) -> dict:
    """One verification step as the extension reports it."""
    return {"accepted": stats.accepted, "emitted": stats.emitted, "tree_size": stats.tree_size}


class TokenSpans:
    """The tokens of one stream, each with where its text ends in the decoded text and its origin.

    `add(end, origin)` after each token; `spans(start, text)` for each piece of text the stream
    sends (characters start .. start + len(text) of the decoded text, in order): that piece cut at
    token boundaries, each part as {"i": token index, "text", "origin"}. A token's text may come in
    two parts (a stream holds back a possible stop string), so parts carry the token's index; a
    token whose text is empty (a special token) is listed once, with "" as its text. Tokens past a
    stop string are never listed: their text is never sent."""

    def __init__(self) -> None:
        self.ends: list[int] = []
        self.origins: list[str] = []
        self._next = 0  # the first token not yet listed to its end

    def add(self, end: int, origin: str) -> None:
        self.ends.append(max(end, self.ends[-1] if self.ends else 0))
        self.origins.append(origin)

    def spans(self, start: int, text: str) -> list[dict]:
        stop, out = start + len(text), []
        i = self._next
        while i < len(self.ends):
            begin, end = self.ends[i - 1] if i else 0, self.ends[i]
            if begin >= stop and not (begin == end == stop):
                break
            lo, hi = max(begin, start), min(end, stop)
            if hi > lo or begin == end:
                out.append({"i": i, "text": text[lo - start:hi - start], "origin": self.origins[i]})
            if end > stop:
                break
            i += 1
        self._next = i
        return out


def tree_label(generator, speculative: bool = True) -> str:
    """The draft tree a request runs with, in words (the per-step `tree_size` says what each step verified)."""
    tree = generator.tree
    if not speculative or tree is None or (generator.head is None and generator.drafter is None):
        return "none (vanilla decoding)"
    tuned = getattr(generator, "tuned", None)
    if tuned is not None and tree is tuned.tree:
        return f"auto: {_static(tree)} (adapts to the batch and to acceptance)"
    if hasattr(tree, "num_nodes"):
        return _static(tree)
    return f"{tree} (EAGLE-2 dynamic tree)"


def _static(tree) -> str:
    return f"{tree.num_nodes - 1} draft nodes, depth {tree.depth}"


def whole_tokens(spans: list[dict]) -> list[dict]:
    """A stream's spans joined back into one entry per token (a non-streaming response lists those)."""
    out: list[dict] = []
    for span in spans:
        if out and out[-1]["i"] == span["i"]:
            out[-1] = {**out[-1], "text": out[-1]["text"] + span["text"]}
        else:
            out.append(span)
    return out
