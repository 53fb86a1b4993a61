"""A weight-only int8 target (the EAGLE paper's EAGLE + gpt-fast case study, on a CPU).

Every linear layer of the target's decoder keeps its weight as int8 with one fp scale per output
channel (symmetric: scale = max|w| / 127) and multiplies through PyTorch's own kernel
`torch._weight_int8pack_mm`. The verifier is this quantized model itself: EAGLE's output equals
vanilla decoding of the same quantized model, which is what "lossless" means here (the quantized
model's text differs from the fp32 model's, as any quantization's does).

Weight-only is the kind a lossless verifier can use: activations stay in the compute dtype and
are never scaled by statistics of the batch, so a token's logits do not depend on the other
tokens verified with it. Dynamic activation quantization (a scale from the max of the whole
input) makes every row depend on every other row of the tree: `eaglespec certify` and
`numerics.measure_invariance` show it, and it is refused here.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import EagleError

QUANTIZATIONS = ("none", "int8")


class Int8WeightOnlyLinear(nn.Module):
    """y = x W^T + b, W stored as int8 [out, in] with per-output-channel scales [out]."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        w = linear.weight.detach().float()
        scales = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        self.register_buffer("weight_int8", (w / scales[:, None]).round().clamp(-128, 127).to(torch.int8))
        self.register_buffer("scales", scales.to(linear.weight.dtype))
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape  # [..., in]
        y = torch._weight_int8pack_mm(x.reshape(-1, shape[-1]), self.weight_int8, self.scales.to(x.dtype))
        y = y.reshape(*shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


def quantize_target(target, method: str) -> int:
    """Quantize the target's decoder in place ('int8': weight-only); -> linear layers replaced.
    The embedding and the LM head stay as they are (the head drafts with the LM head, and a tied
    embedding is the same tensor)."""
    if method in (None, "none"):
        return 0
    if method in ("int8-dynamic", "dynamic"):
        raise EagleError("--quantize int8-dynamic: dynamic activation quantization scales each input by the "
                         "max of the whole batch, so a token's logits depend on the other tokens verified with it; "
                         "it cannot be a lossless verifier. Use --quantize int8 (weight-only)")
    if method != "int8":
        raise EagleError(f"--quantize {method!r}: choose one of {', '.join(QUANTIZATIONS)}")
    if target.dtype == torch.float16 and target.device.type == "cpu":
        raise EagleError("--quantize int8 with float16 on a CPU: use --dtype float32 or bfloat16")
    count = 0
    for module in list(target.decoder.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, Int8WeightOnlyLinear(child))
                count += 1
    if count == 0:
        raise EagleError(f"{target.config.model_type}: no nn.Linear layers in the decoder to quantize")
    target.quantization = method
    return count
