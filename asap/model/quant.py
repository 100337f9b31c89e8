"""Block-FP8 checkpoints (DeepSeek-V3/R1, Qwen3-*-FP8): `quantization_config` and dequantisation at load.

Format: a linear weight W [out, in] is stored as float8_e4m3fn, and beside it
`<name>_scale_inv` [ceil(out/bo), ceil(in/bi)] float32 holds one scale per
bo x bi block; the real weight is W * scale (block-wise). Tensors without a
`_scale_inv` companion (embeddings, norms, the router, the LM head) are stored
in a normal dtype. Loaded, block-FP8 weights stay FP8 in memory with their
scales: the routed experts in asap.model.moe.ExpertShard (one layer dequantised
when it runs), every other linear weight as an asap.model.fp8.BlockFp8Weight
(run by asap.model.layers.linear). `dequantize` here is the one dequantisation
all of them use, so every path computes the same numbers.
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
    """W [out,in] float8 and scale_inv [ceil(out/bo), ceil(in/bi)] -> W * scale in `dtype`, on W's device."""
    check_scale(weight, scale_inv, block, name, source)
    out = torch.empty(weight.shape, dtype=dtype, device=weight.device)
    return dequantize_into(weight, scale_inv.float(), block, out)


# Elements dequantised per step in float32 (32 MiB): bounds the transient whatever the weight's size.
DEQUANT_STEP_ELEMS = 2**23


def dequantize_into(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int],
                    out: torch.Tensor) -> torch.Tensor:
    """out[:] = weight * scale block-wise, whole rows of blocks at a time (about DEQUANT_STEP_ELEMS each).

    Each element is the float32 product fp8(w) * scale rounded once to out's dtype, however the rows are
    stepped through: every caller (load, expert shard, a linear at compute time) gets the same bits."""
    O, I = weight.shape
    bo, bi = block
    step = bo * max(1, DEQUANT_STEP_ELEMS // (bo * max(I, 1)))
    whole_cols = I % bi == 0
    for r0 in range(0, O, step):
        r1 = min(r0 + step, O)
        s = scale[r0 // bo: -(-r1 // bo)]
        if whole_cols and (r1 - r0) % bo == 0:      # whole blocks: broadcast the scales, no expanded copy
            nO, nI = (r1 - r0) // bo, I // bi
            out[r0:r1].view(nO, bo, nI, bi).copy_(weight[r0:r1].float().view(nO, bo, nI, bi) * s[:, None, :, None])
        else:
            full = s.repeat_interleave(bo, 0)[:r1 - r0].repeat_interleave(bi, 1)[:, :I]
            out[r0:r1] = weight[r0:r1].float() * full
    return out


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
