"""For the token-origin tests (API and chat page): a tiny chat generator whose drafter is mostly
right and wrong on purpose now and then, so that replies hold accepted draft tokens, bonus tokens
and recovered tokens; the origins a stream's per-step counts imply; a streamed request, parsed."""

from __future__ import annotations

import json

import httpx
import pytest
from oracle import OracleDrafter
from serve_helpers import live_server
from tiny_tokenizer import tiny_chat_generator

from eaglespec.core.tree import static_tree
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.serve import ServeConfig, create_app

PATHS = [[0], [1], [0, 0], [0, 1], [0, 0, 0]]
PARENTS = [-1, 0, 0, 1, 1, 3]  # static_tree(PATHS)'s nodes, sorted by (depth, path)
IM_START = 4  # tiny_tokenizer's <|im_start|>: every chat prompt starts with it


class FlakyOracle(OracleDrafter):
    """OracleDrafter (always right at rank 0) but wrong at its depth-2 rank-0 node when the
    sequence's length is a multiple of `every`: such a step accepts one draft token (rarely two)
    and the target's token is a recovered one. Its drafts depend on the sequence only, so the
    same prompt gets the same steps in every request."""

    def __init__(self, target, every: int = 3):
        super().__init__(target, [IM_START], PARENTS)
        self.every = every

    def draft_one(self, history, new_tokens, new_features, root):
        length = len(history) + len(new_tokens)
        self.g.manual_seed(length)  # the wrong ranks' random tokens, the same in every request
        tree = super().draft_one(history, new_tokens, new_features, root)
        if length % self.every == 0:
            tree.tokens[3] = (tree.tokens[3] + 1) % self.target.vocab_size
        return tree


def flaky_generator() -> EagleGenerator:
    target = tiny_chat_generator().target
    return EagleGenerator(target, drafter=FlakyOracle(target), tree=static_tree(PATHS))


@pytest.fixture(scope="module")
def gen():
    return flaky_generator()


@pytest.fixture(scope="module")
def server(gen):
    """A live server on the flaky generator; yields its base URL."""
    with live_server(create_app(gen, ServeConfig(max_tokens=64))) as url:
        yield url


def drafted_marks(steps: list[dict]) -> list[bool]:
    """For each token of a reply, whether it is an accepted draft token, from the per-step counts
    (the first token is the prefill's)."""
    marks = [False]
    for s in steps:
        drafted = min(s["accepted"], s["emitted"])
        marks += [True] * drafted + [False] * (s["emitted"] - drafted)
    return marks


def stream(url: str, body: dict, path: str = "/v1/chat/completions") -> list[dict]:
    """The chunks of a streamed request, parsed (the closing [DONE] checked and dropped)."""
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200, r.read()
        lines = [line.removeprefix("data: ") for line in r.iter_lines() if line]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def extension(chunks: list[dict], key: str) -> list:
    """The items under `key` ("tokens", "steps") of every chunk's eaglespec field, in order."""
    return [x for c in chunks for x in c.get("eaglespec", {}).get(key, [])]
