"""Small numeric building blocks shared by every stage.

Shape legend: T tokens (packed over requests), D hidden, H heads, R rope dim.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from asap.model.fp8 import BlockFp8Weight, fp8_linear


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Normalise in float32 whatever the storage dtype, as the HF reference does.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def linear(x: torch.Tensor, weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias), for every projection of the model math: a weight is a tensor in the runtime
    dtype, or a block-FP8 weight kept FP8 in memory (asap.model.fp8.BlockFp8Weight, a block-FP8 checkpoint's)."""
    if isinstance(weight, BlockFp8Weight):
        return fp8_linear(x, weight, bias)
    return F.linear(x, weight, bias)


def gated_ffn(x: torch.Tensor, gate_up, down) -> torch.Tensor:
    """SwiGLU FFN. x [T,D], gate_up [2I,D] (gate rows then up rows), down [D,I] -> [T,D]; tensors or
    block-FP8 weights (`linear`)."""
    g, u = linear(x, gate_up).chunk(2, dim=-1)
    return linear(F.silu(g) * u, down)


class Rotary:
    """RoPE tables; `apply` rotates the first 2*len(inv_freq) channels of [T, H, d] by per-token positions [T].

    inv_freq and attention_factor come from asap.model.rope (the config's scaling); the channels past the
    rotary dimension (partial rotary, GLM-4.5) pass through unchanged."""

    def __init__(self, inv_freq: torch.Tensor, interleave: bool = False, attention_factor: float = 1.0, device=None):
        self.interleave, self.attention_factor = interleave, attention_factor
        self.inv_freq = inv_freq.to(device=device, dtype=torch.float32)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq.to(positions.device)[None, :]   # [T, R/2]
        f = self.attention_factor
        return (freqs.cos() * f).to(dtype)[:, None, :], (freqs.sin() * f).to(dtype)[:, None, :]   # [T, 1, R/2]

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        rd = 2 * cos.shape[-1]
        if rd < x.shape[-1]:
            return torch.cat((self.apply(x[..., :rd], cos, sin), x[..., rd:]), dim=-1)
        if self.interleave:
            # DeepSeek pairs (x0,x1),(x2,x3)..; output is de-interleaved [evens | odds] as in HF.
            x1, x2 = x[..., 0::2], x[..., 1::2]
        else:
            x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
