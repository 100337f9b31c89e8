"""Block-FP8 linear weights kept FP8 in memory, and the linear that runs them.

A block-FP8 checkpoint (DeepSeek-V3's format, asap.model.quant) stores a linear
weight W [out, in] as float8_e4m3fn beside float32 `weight_scale_inv`
[ceil(out/bo), ceil(in/bi)]: the real weight is W * scale, block by block.
BlockFp8Weight keeps exactly that resident (1 byte a weight, 4 bytes a block),
so the attention side (attention projections, shared experts, dense MLPs) takes
about half its bf16 size, as the routed experts already do (asap.model.moe).

`fp8_linear` (reached through asap.model.layers.linear) runs one:
  * on CUDA with compute capability >= 9.0, 128x128 blocks, both features
    multiples of 128, and a torch with torch.nn.functional.scaled_mm's
    block-wise recipes: one block-scaled FP8 GEMM, the activations quantised to
    FP8 per 1x128 token group (DeepSeek-V3's own dynamic scheme: scale = group
    amax / 448). NOT RUN by this project's tests (no GPU here): the argument
    layouts are checked against torch's own shape/stride checks on the meta
    device (tests/test_model_fp8.py), and any failure to find or run the kernel
    falls back to the next branch, once per device, never crashing;
  * everywhere else (CPU, older torch, shapes the kernel cannot take): this one
    weight is dequantised into the activation dtype, then F.linear. Those are
    the numbers dequantising at load gave (asap.model.quant.dequantize_into), so
    on a CPU the result is the old load-time path's bit for bit.
"""
from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F

from asap.model.quant import dequantize_into

FP8_MAX = torch.finfo(torch.float8_e4m3fn).max       # 448
GROUP = 128                  # the block-scaled GEMM's granularity: 1x128 activations, 128x128 weights

# Device types where the block-scaled FP8 GEMM is tried (a test may empty it to force the fallback).
SCALED_MM_ON = {"cuda"}
# Devices where the kernel failed once, with why: it is never retried there (the fallback runs instead).
SCALED_MM_FAILED: dict[torch.device, str] = {}


@dataclass(frozen=True, eq=False)
class BlockFp8Weight:
    """One linear weight as the checkpoint stores it, kept so in memory (see the module docstring).

    It stands where a weight tensor stood in a layer's dict; asap.model.layers.linear runs it, and
    F.linear(x, w, b) anywhere else is routed to the same function (__torch_function__), so code that
    times or calls the model's linears keeps working. It offers `shape` (the real weight's) but no
    other tensor behaviour: anything else is an error naming the operation."""
    weight: torch.Tensor          # [out, in] float8_e4m3fn
    scale_inv: torch.Tensor       # [ceil(out/bo), ceil(in/bi)] float32
    block: tuple[int, int]        # (bo, bi)

    @property
    def shape(self) -> torch.Size:
        return self.weight.shape

    @property
    def device(self) -> torch.device:
        return self.weight.device

    def nbytes(self) -> int:
        """Resident bytes: the FP8 weight and its scales."""
        return sum(t.numel() * t.element_size() for t in (self.weight, self.scale_inv))

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """The real weight [out, in] in `dtype` (a transient: the caller drops it after one linear)."""
        out = torch.empty(self.weight.shape, dtype=dtype, device=self.weight.device)
        return dequantize_into(self.weight, self.scale_inv, self.block, out)

    @classmethod
    def cat_rows(cls, parts: list["BlockFp8Weight"]) -> "BlockFp8Weight | None":
        """The parts stacked along the output rows (a fused gate_up), or None where that is not one block-FP8
        weight: different blocks or widths, or a part other than the last ending inside a row of blocks."""
        block = parts[0].block
        if any(p.block != block or p.shape[1] != parts[0].shape[1] for p in parts) or \
                any(p.shape[0] % block[0] for p in parts[:-1]):
            return None
        return cls(torch.cat([p.weight for p in parts]), torch.cat([p.scale_inv for p in parts]), block)

    @cached_property
    def cublas_scale(self) -> torch.Tensor:
        """scale_inv in the layout the block-scaled GEMM takes for its 128x128-scaled operand (torch's
        _meta_registrations.py, `is_1x128_128x128`; cuBLAS's 2-D block scaling): shape [L4, N/128] with
        stride [1, L4], L4 = K/128 rounded up to a multiple of 4, the padded blocks zero. Made once."""
        n_blocks, k_blocks = self.scale_inv.shape
        l4 = -(-k_blocks // 4) * 4
        return F.pad(self.scale_inv.float(), (0, l4 - k_blocks)).contiguous().t()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is F.linear:
            return fp8_linear(*_linear_args(*args, **(kwargs or {})))
        raise TypeError(f"{func.__name__}() is not supported on a block-FP8 weight (BlockFp8Weight): "
                        "run it with asap.model.layers.linear, or dequantize() it first")


def _linear_args(input, weight, bias=None):   # noqa: A002 - F.linear's own parameter names
    return input, weight, bias


def fp8_linear(x: torch.Tensor, weight: BlockFp8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., in] @ W.T (+ bias) -> [..., out] in x's dtype; see the module docstring for the two branches."""
    if _scaled_mm_applies(x, weight):
        try:
            return _scaled_mm_linear(x, weight, bias)
        except torch.OutOfMemoryError:
            raise       # a full device, not a missing kernel: the fallback needs more memory, and the GEMM stays on
        except Exception as e:  # noqa: BLE001 - any refusal (no kernel for this GPU/CUDA, a layout) falls back
            SCALED_MM_FAILED[x.device] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            warnings.warn(f"block-scaled FP8 GEMM unavailable on {x.device} ({SCALED_MM_FAILED[x.device]}); "
                          "dequantising block-FP8 weights per linear instead", RuntimeWarning, stacklevel=2)
    return F.linear(x, weight.dequantize(x.dtype), bias)


@functools.cache
def block_scaled_mm_api():
    """(F.scaled_mm, ScalingType.BlockWise1x128, ScalingType.BlockWise128x128) where this torch has them
    (torch >= 2.10's scaled_mm with recipes), else None. Older torch's torch._scaled_mm infers block-wise
    scaling from the scales' shapes; it is not used: the fallback runs there instead."""
    scaled_mm = getattr(F, "scaled_mm", None)
    recipes = getattr(F, "ScalingType", None)
    one_by_128 = getattr(recipes, "BlockWise1x128", None)
    block_128 = getattr(recipes, "BlockWise128x128", None)
    if scaled_mm is None or one_by_128 is None or block_128 is None:
        return None
    return scaled_mm, one_by_128, block_128


@functools.cache
def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def _scaled_mm_applies(x: torch.Tensor, w: BlockFp8Weight) -> bool:
    """Whether the block-scaled GEMM can run this linear: the device, the API, the block and the shapes
    (the kernel's scale layouts need whole 128-blocks: K/128 scales per token, N/128 x K/128 per weight)."""
    if x.device.type not in SCALED_MM_ON or x.device in SCALED_MM_FAILED or block_scaled_mm_api() is None:
        return False
    n, k = w.shape
    if w.block != (GROUP, GROUP) or k % GROUP or n % GROUP or x.shape[-1] != k or x.numel() == 0:
        return False
    if x.dtype not in (torch.bfloat16, torch.float32) or w.weight.dtype != torch.float8_e4m3fn:
        return False          # the output dtypes torch's block-wise tests cover
    return w.weight.is_contiguous() and _capability(x.device) >= (9, 0)


def quantize_activations_1x128(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (q [M, K] float8_e4m3fn, row-major; scale [M, K/128] float32) with x ~= q * scale per
    1x128 group of a token's features: DeepSeek-V3's dynamic activation quantisation (amax / 448)."""
    m, k = x.shape
    groups = x.float().reshape(m, k // GROUP, GROUP)
    scale = (groups.abs().amax(dim=-1) / FP8_MAX).clamp(min=1e-12)         # an all-zero group: q = 0
    q = (groups / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.reshape(m, k), scale


def _scaled_mm_linear(x: torch.Tensor, w: BlockFp8Weight, bias: torch.Tensor | None) -> torch.Tensor:
    """The CUDA branch: one F.scaled_mm with recipes (BlockWise1x128, BlockWise128x128), written against
    torch's checks for that pair (torch/_meta_registrations.py, `is_1x128_128x128`) and its CUDA tests
    (test/test_scaled_matmul_cuda.py, test_scaled_mm_block_wise_numerics):
      mat_a  [M, K] fp8, row-major                 the quantised activations
      mat_b  [K, N] fp8, column-major              W.t() of the contiguous [N, K] weight (a view)
      scale_a [M, K/128] fp32, stride [1, M]       per-token group scales, "outer-dim-major"
      scale_b [L4, N/128] fp32, stride [1, L4]     W's scale_inv, K-blocks padded to L4 (cublas_scale)
    Scales are dequantisation factors (value = fp8 * scale), as DeepSeek's scale_inv is. Tokens are padded
    to a multiple of 16 rows (zero rows, scale 1e-12, dropped after): insurance for cuBLAS's alignment of
    scale_a's leading dimension, which torch's checks leave open. The bias is added after the GEMM."""
    scaled_mm, one_by_128, block_128 = block_scaled_mm_api()
    n, k = w.shape
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    if m % 16:
        x2 = F.pad(x2, (0, 0, 0, 16 - m % 16))
    q, scale = quantize_activations_1x128(x2)
    out = scaled_mm(q, w.weight.t(), scale.t().contiguous().t(), one_by_128, w.cublas_scale, block_128,
                    output_dtype=x.dtype)[:m]
    if bias is not None:
        out = out + bias
    return out.reshape(*lead, n)
