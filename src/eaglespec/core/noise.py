"""Keyed Gumbel noise for reproducible sampling (PURE).

Reproducible sampling emits, at sequence position t, the token
    x[t] = argmax_v ( log p_t(v) + g(seed, t, v) )
where p_t is the target's processed distribution (core/sampling.py: temperature, top-k, top-p;
log p = -inf outside the filter) and g(seed, t, v) are i.i.d. standard Gumbel variables. By the
Gumbel-max trick x[t] is distributed as p_t, and it is a function of p_t and of (seed, t) alone:
not of the tree, the batch, the head or the draws made before it. Verification is then greedy
verification against these perturbed targets, so EAGLE emits exactly the seeded vanilla sample.

The noise is a counter-based stream: g(seed, t, v) is computed from the three integers by a
splitmix64 hash (Steele, Lea, Flood, OOPSLA 2014) in int64 tensor arithmetic (multiplication wraps
modulo 2**64 on every torch device), then u = (h >> 11 + 1/2) / 2**53 in (0, 1) and
g = -log(-log u) in float64. Nothing reads torch's global RNG, so the same (seed, t) gives the same
[V] vector in any process, batch or tree, and any subset of token ids can be computed on its own.
`reference_gumbel` is the same function in plain Python integers: the definition the tests pin.
The hash is exact integer arithmetic; only the two float64 logs may differ by an ulp between
devices' math libraries (a 1e-16 change, far below the logits' own rounding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment (2**64 / golden ratio)
MIX1, MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
POSITION_SALT = 0xD1B54A32D192ED03  # distinct odd multipliers, so (t, v) and (v, t) do not collide
TOKEN_SALT = 0xCA5A826395121157


def key64(seed: int) -> int:
    """A seed in [-2**63, 2**64) (the range torch.Generator.manual_seed accepts) as the stream's
    64-bit key: a negative seed is read as its two's complement, so -1 and 2**64 - 1 are one key."""
    if not -2**63 <= seed < 2**64:
        raise ValueError(f"seed must be in [-2**63, 2**64), got {seed}")
    return seed & MASK64


def _signed(x: int) -> int:
    """A 64-bit pattern as the int64 torch holds it."""
    return x - (1 << 64) if x >= 1 << 63 else x


def _srl(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's >> is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 bit patterns."""
    x = (x ^ _srl(x, 30)) * _signed(MIX1)
    x = (x ^ _srl(x, 27)) * _signed(MIX2)
    return x ^ _srl(x, 31)


def gumbel(seed: int, positions: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """g(seed, t, v) for every t in positions [P] and v in ids [M] -> [P, M] float64, on ids' device.
    positions, ids: long (absolute sequence positions; target token ids)."""
    out = ids.device
    device = torch.device("cpu") if out.type == "mps" else out  # MPS has no float64 (or int64 shifts we trust)
    ids = ids.to(device)
    key = torch.tensor(_signed(key64(seed)), dtype=torch.long, device=device)
    t = positions.to(device=device, dtype=torch.long)[:, None]  # [P, 1]
    v = ids.to(torch.long)[None, :]                             # [1, M]
    h = _mix(key + _signed(GOLDEN))                       # the stream's key: one splitmix64 step
    h = _mix(h ^ (t * _signed(POSITION_SALT)))                  # [P, 1]
    h = _mix(h ^ (v * _signed(TOKEN_SALT)))                     # [P, M]
    u = (_srl(h, 11).double() + 0.5) * 2.0**-53                 # (0, 1), exact in float64
    g = -torch.log(-torch.log(u))
    return g if device == out else g.to(torch.float32).to(out)


def reference_gumbel(seed: int, position: int, token: int) -> float:
    """The same g(seed, t, v) in plain Python integers: the definition of the stream."""
    def mix(x: int) -> int:
        x = ((x ^ (x >> 30)) * MIX1) & MASK64
        x = ((x ^ (x >> 27)) * MIX2) & MASK64
        return x ^ (x >> 31)

    h = mix((key64(seed) + GOLDEN) & MASK64)
    h = mix(h ^ ((position * POSITION_SALT) & MASK64))
    h = mix(h ^ ((token * TOKEN_SALT) & MASK64))
    return -math.log(-math.log(((h >> 11) + 0.5) * 2.0**-53))


def perturbed_argmax(scores: torch.Tensor, seed: int, position: int) -> int:
    """The token reproducible sampling emits at `position`: argmax_v (scores[v] + g(seed, position, v)).
    scores: [V] processed log-probabilities up to a constant (sampling.processed_scores: -inf
    outside top-k / top-p). Noise is computed only for the tokens the filters keep."""
    kept = torch.isfinite(scores).nonzero().flatten()  # [M]
    if kept.numel() == 0:
        raise ValueError("perturbed_argmax: no finite score (the target's logits are NaN or all -inf)")
    if scores.device.type == "mps":
        scores, kept = scores.cpu(), kept.cpu()
    noise = gumbel(seed, torch.tensor([position]), kept)[0]  # [M]
    return int(kept[(scores[kept].double() + noise).argmax()])


@dataclass(frozen=True)
class DraftNoise:
    """The noise one sequence's drafter adds to its own distribution q (reproducible sampling): the
    children of a depth-d node are candidates for sequence position `position + d`, whose target
    token is the perturbed argmax of p there, so the draft ranks log q / temperature + g there."""

    seed: int           # the sequence's key (key64 range)
    position: int       # sequence position of the root's children
    temperature: float  # the target's; q is sharpened as p is


def perturbed_logprobs(logq: torch.Tensor, noise: DraftNoise, depth: int, ids: torch.Tensor) -> torch.Tensor:
    """[..., M] draft log-probabilities over target ids [M] -> log_softmax(log q / T + g(seed,
    position + depth, ids)): a distribution whose argmax is q's perturbed choice, so that EAGLE-2's
    cumulative scores stay log-probabilities (a child never above its parent)."""
    g = gumbel(noise.seed, torch.tensor([noise.position + depth]), ids)[0]  # [M]
    wide = torch.float32 if logq.device.type == "mps" else torch.float64
    scores = logq.to(wide) / noise.temperature + g.to(wide)
    return scores.log_softmax(dim=-1).to(torch.promote_types(logq.dtype, torch.float32))
