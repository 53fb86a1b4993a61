"""Typed, frozen configuration: sampling parameters and the draft-tree choice."""

from __future__ import annotations

import functools
import math
import sys
from dataclasses import dataclass

from ..errors import EagleError


GREEDY_BELOW = 1e-5  # temperatures below this decode greedily (as vLLM's _SAMPLING_EPS)
SPECULATIVE, REPRODUCIBLE = "speculative", "reproducible"
SAMPLING_MODES = (SPECULATIVE, REPRODUCIBLE)  # how sampled drafts are verified: see SamplingParams.mode
# The default, chosen from `eaglespec bench-modes` (docs/benchmarks.md): it accepted as many or more
# drafts at temperature 0.7 and 1.0 for the same speed, and its seeded sample is vanilla's.
DEFAULT_SAMPLING_MODE = REPRODUCIBLE


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy (argmax); > 0 samples from softmax(logits / temperature); below
                              # GREEDY_BELOW it is greedy too (softmax of logits / 1e-38 overflows to inf)
    top_p: float = 1.0        # nucleus: keep the smallest set of tokens with cumulative probability >= top_p
    top_k: int = 0            # keep the k most likely tokens; 0 = all
    seed: int | None = None   # seeds the sampler (draws of acceptance tests and of tokens); None: a fresh one
    mode: str = DEFAULT_SAMPLING_MODE  # reproducible (default): Gumbel noise keyed on (seed, position), the
                              # seeded vanilla sample token for token; speculative: multi-round speculative
                              # sampling (the target's distribution; a seeded sample may depend on the tree
                              # and the batch)

    def __post_init__(self) -> None:
        t, p, k = self.temperature, self.top_p, self.top_k
        if not isinstance(t, (int, float)) or math.isnan(t) or t < 0:
            raise EagleError(f"temperature must be >= 0 (0 = greedy), got {t}")
        if not isinstance(p, (int, float)) or math.isnan(p) or not 0 < p <= 1:
            raise EagleError(f"top_p must be in (0, 1], got {p}; use 1.0 to turn top-p off")
        if not isinstance(k, int) or k < 0:
            raise EagleError(f"top_k must be an integer >= 0, got {k}; use 0 to turn top-k off")
        s = self.seed
        if s is not None and (not isinstance(s, int) or not -2**63 <= s < 2**64):
            raise EagleError(f"seed must be an integer in [-2**63, 2**64), got {s}")
        if self.mode not in SAMPLING_MODES:
            raise EagleError(f"sampling_mode must be one of {', '.join(SAMPLING_MODES)}, got {self.mode!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


@dataclass(frozen=True)
class DynamicTreeSpec:
    """EAGLE-2: grow `depth` levels, expanding the `top_k` best nodes of each level by cumulative
    draft log-probability, then keep the best `total_tokens` draft nodes (the root not counted)."""

    top_k: int = 4         # children per expanded node, and nodes expanded per level
    depth: int = 4         # draft levels below the root
    total_tokens: int = 12  # draft nodes verified (EAGLE-2's GPU default is 60; on a CPU verify cost rises fast)

    def __post_init__(self) -> None:
        if min(self.top_k, self.depth, self.total_tokens) < 1:
            raise EagleError(f"dynamic tree needs top_k, depth, total_tokens >= 1, got {self}")
        if self.total_tokens > self.capacity:
            raise EagleError(f"dynamic tree {self}: top-k {self.top_k} over {self.depth} levels grows at most "
                             f"{self.capacity} draft nodes (K + K^2(D-1)), fewer than the {self.total_tokens} asked; "
                             f"give N <= {self.capacity}, or a larger K or D")

    @property
    def capacity(self) -> int:
        """Draft nodes the growth creates: K children of the root, then K children of each of the K
        nodes expanded at every level below."""
        return self.top_k + self.top_k ** 2 * (self.depth - 1)

    def __str__(self) -> str:
        return f"dynamic:{self.top_k},{self.depth},{self.total_tokens}"


TREE_HELP = ("eagle1 (EAGLE-1's 25-node tree), chain:N (N draft tokens in a row), dynamic[:K,D,N] (EAGLE-2, top-k K, "
             "depth D, N nodes), eagle2:T,D,K (the official EAGLE-2 settings total_token, depth, top_k = "
             "dynamic:K,D+1,T-1), FILE.json (a list of paths such as [[0], [1], [0, 0]]), none (vanilla)")


def official_eagle2(total_token: int, depth: int, top_k: int) -> DynamicTreeSpec:
    """The official EAGLE-2 code's (total_token T, depth D, top_k K) as our tree: its total_token
    counts the root (the last accepted token), ours only draft nodes; its depth counts the levels
    grown after the first (its first draft forward already yields the root's top_k children),
    ours every level below the root. Checked step by step against the official code (issue #11):
    the same accept lengths at every verification step."""
    if total_token < 2 or depth < 0 or top_k < 1:
        raise EagleError(f"eagle2:{total_token},{depth},{top_k}: the official EAGLE-2 settings need total_token >= 2, "
                         "depth >= 0 and top_k >= 1")
    return DynamicTreeSpec(top_k=top_k, depth=depth + 1, total_tokens=total_token - 1)


@functools.cache
def _note_once(line: str) -> None:
    print(line, file=sys.stderr)


def parse_tree(text: str):
    """'eagle1' | 'chain:N' | 'dynamic' | 'dynamic:K,D,N' | 'eagle2:T,D,K' | 'FILE.json' | 'none'
    -> StaticTree | DynamicTreeSpec | None. The official EAGLE-2 spelling prints its mapping once."""
    import json
    from pathlib import Path

    from .tree import EAGLE1_TREE, chain, static_tree

    if text.endswith(".json"):
        try:
            paths = json.loads(Path(text).read_text())
            return static_tree([tuple(int(r) for r in path) for path in paths])
        except OSError as exc:
            raise EagleError(f"tree file {text} cannot be read ({exc.strerror})") from exc
        except (TypeError, ValueError) as exc:
            raise EagleError(f"tree file {text} is not a JSON list of paths like [[0], [1], [0, 0]] ({exc})") from exc

    name, _, arg = text.strip().partition(":")
    if name == "dynamic" and arg and len(arg.split(",")) != 3:  # a partial list would keep defaults silently
        raise EagleError(f"bad tree {text!r}: dynamic takes all three numbers, dynamic:K,D,N (top-k K, depth D, "
                         f"N draft nodes), e.g. {DynamicTreeSpec()}; or plain dynamic for that default")
    if name == "eagle2" and len(arg.split(",")) != 3:
        raise EagleError(f"bad tree {text!r}: eagle2 takes the official EAGLE-2 settings total_token,depth,top_k, "
                         "e.g. eagle2:60,5,10 (its GPU default)")
    try:
        if name == "eagle1" and not arg:
            return static_tree(EAGLE1_TREE)
        if name == "chain":
            return chain(int(arg))
        if name == "dynamic":
            return DynamicTreeSpec(*(int(x) for x in arg.split(","))) if arg else DynamicTreeSpec()
        if name == "eagle2":
            spec = official_eagle2(*(int(x) for x in arg.split(",")))
            _note_once(f"[eaglespec] tree {text.strip()}: official EAGLE-2 total_token={spec.total_tokens + 1}, "
                       f"depth={spec.depth - 1}, top_k={spec.top_k} is our {spec}")
            return spec
        if name == "none" and not arg:
            return None
    except EagleError:
        raise
    except (TypeError, ValueError) as exc:
        raise EagleError(f"bad tree {text!r} ({exc}); use one of: {TREE_HELP}") from exc
    raise EagleError(f"unknown tree {text!r}; use one of: {TREE_HELP}")
