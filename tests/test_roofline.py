"""The roofline command's pieces on a tiny target (no timing is asserted)."""

import torch
from conftest import tiny_target

from eaglespec.bench import roofline
from eaglespec.engine.target import EagerSteps


def test_weight_bytes_counts_each_matrix_once_and_one_embedding_row():
    target = tiny_target("llama", dtype=torch.float32, check=False)
    params = {p.data_ptr(): p for p in target.decoder.parameters()} | {p.data_ptr(): p for p in target.lm_head.parameters()}
    total = sum(p.numel() * 4 for p in params.values())
    embed = target.embed_tokens.weight
    tied = embed.data_ptr() in {p.data_ptr() for p in target.lm_head.parameters()}
    expected = total if tied else total - embed.numel() * 4 + embed.shape[1] * 4
    assert roofline.weight_bytes(target) == expected < total + 1


def test_step_times_interleave_the_read_with_the_steps():
    target = tiny_target("llama", dtype=torch.float32, check=False)
    times = roofline.step_times(target, {"eager": EagerSteps(target)}, [1, 2], context=8, rounds=2, read_bytes=1 << 16)
    assert set(times) == {("eager", 1), ("eager", 2), roofline.READ} and all(t > 0 for t in times.values())
    assert roofline.READ not in roofline.step_times(target, {"eager": EagerSteps(target)}, [1], context=8, rounds=1)
