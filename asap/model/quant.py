"""Block-FP8 checkpoints (DeepSeek-V3/R1, Qwen3-*-FP8): `quantization_config` and dequantisation at load.

Format: a linear weight W [out, in] is stored as float8_e4m3fn, and beside it
`<name>_scale_inv` [ceil(out/bo), ceil(in/bi)] float32 holds one scale per
bo x bi block; the real weight is W * scale (block-wise). Tensors without a
`_scale_inv` companion (embeddings, norms, the router, the LM head) are stored
in a normal dtype. The routed experts (nearly all of a DeepSeek-V3's bytes)
stay FP8 in memory with their scales (asap.model.moe.ExpertShard dequantises
one layer when it runs); the attention side's weights are dequantised into the
runtime dtype one tensor at a time as a worker reads them, so peak memory
stays one tensor above the slice.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from asap.model.errors import ModelLoadError, describe

SCALE_SUFFIX = "_scale_inv"


@dataclass(frozen=True)
class QuantConfig:
    method: str = "fp8"
    fmt: str = "e4m3"
    block: tuple[int, int] = (128, 128)
    activation_scheme: str = "dynamic"
    not_converted: tuple[str, ...] = ()     # modules_to_not_convert: stored unquantised

    @property
    def storage_dtype(self) -> torch.dtype:
        return torch.float8_e4m3fn


def parse_quant(hf: dict, source) -> QuantConfig | None:
    q = hf.get("quantization_config")
    if q is None:
        return None
    if not isinstance(q, dict):
        raise ModelLoadError(source, f"field 'quantization_config' must be an object, got {describe(q)}")
    method = q.get("quant_method")
    if method != "fp8":
        raise ModelLoadError(source, f"field 'quantization_config': quant_method {method!r} is not supported "
                                     "(supported: 'fp8' with 128x128-style weight blocks)")
    fmt = q.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ModelLoadError(source, f"field 'quantization_config': fp8 fmt {fmt!r} is not supported (only 'e4m3')")
    block = q.get("weight_block_size")
    if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and not isinstance(b, bool)
                                                                    and b > 0 for b in block)):
        raise ModelLoadError(source, "field 'quantization_config': weight_block_size must be two positive integers "
                                     f"(per-tensor fp8 is not supported), got {describe(block)}")
    scheme = q.get("activation_scheme", "dynamic")
    if scheme != "dynamic":
        raise ModelLoadError(source, f"field 'quantization_config': activation_scheme {scheme!r} is not supported "
                                     "(only 'dynamic')")
    skip = q.get("modules_to_not_convert") or []
    if not isinstance(skip, list) or not all(isinstance(s, str) for s in skip):
        raise ModelLoadError(source, "field 'quantization_config': modules_to_not_convert must be a list of names")
    return QuantConfig("fp8", fmt, (block[0], block[1]), scheme, tuple(skip))


def expand_scales(scale_inv: torch.Tensor, shape: tuple[int, int], block: tuple[int, int]) -> torch.Tensor:
    bo, bi = block
    return scale_inv.repeat_interleave(bo, 0)[:shape[0]].repeat_interleave(bi, 1)[:, :shape[1]]


def check_scale(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int], name: str = "",
                source="") -> None:
    """A block-FP8 weight is 2-D and its scale has one entry per block; else ModelLoadError."""
    if weight.dim() != 2:
        raise ModelLoadError(source, f"tensor {name!r}: a block-FP8 weight must be 2-D, got {tuple(weight.shape)}")
    want = (-(-weight.shape[0] // block[0]), -(-weight.shape[1] // block[1]))
    if tuple(scale_inv.shape) != want:
        raise ModelLoadError(source, f"tensor {name + SCALE_SUFFIX!r} has shape {tuple(scale_inv.shape)}, expected "
                                     f"{want} for a {tuple(weight.shape)} weight in {block[0]}x{block[1]} blocks")


def dequantize(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int], dtype: torch.dtype,
               name: str = "", source="") -> torch.Tensor:
    """W [out,in] float8 and scale_inv [ceil(out/bo), ceil(in/bi)] -> W * scale in `dtype`, one block row at a time."""
    check_scale(weight, scale_inv, block, name, source)
    out_f, in_f = weight.shape
    bo, bi = block
    result = torch.empty(out_f, in_f, dtype=dtype)
    scale = scale_inv.float()
    for r in range(scale.shape[0]):                 # one row of blocks in float32 at a time
        rows = slice(r * bo, min((r + 1) * bo, out_f))
        w = weight[rows].float() * scale[r].repeat_interleave(bi)[:in_f][None, :]
        result[rows] = w.to(dtype)
    return result


def quantize(weight: torch.Tensor, block: tuple[int, int] = (128, 128)) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse, as DeepSeek's conversion does it: per block, scale = amax / 448. For tests and presets."""
    out_f, in_f = weight.shape
    bo, bi = block
    nbo, nbi = -(-out_f // bo), -(-in_f // bi)
    padded = torch.zeros(nbo * bo, nbi * bi)
    padded[:out_f, :in_f] = weight.float()
    amax = padded.view(nbo, bo, nbi, bi).abs().amax(dim=(1, 3))
    scale = (amax / torch.finfo(torch.float8_e4m3fn).max).clamp(min=1e-12)
    q = (weight.float() / expand_scales(scale, (out_f, in_f), block)).to(torch.float8_e4m3fn)
    return q, scale


def quantizable(name: str, shape) -> bool:
    """The tensors block-FP8 checkpoints store in FP8: 2-D linear weights but the embedding, LM head and router."""
    return len(shape) == 2 and name.endswith(".weight") and not any(
        s in name for s in ("embed_tokens", "lm_head", "mlp.gate.weight"))
