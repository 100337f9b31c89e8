"""Block-FP8 checkpoints stay FP8 in memory (issue 26 point 2).

The expert shard keeps float8_e4m3fn weights with their float32 block scales and dequantises one
layer when it runs; every other linear weight (attention projections, shared experts, dense MLPs)
stays FP8 too, as an asap.model.fp8.BlockFp8Weight that asap.model.layers.linear runs. On a CPU the
numbers are the ones dequantising at load gave, bit for bit. With that layout the full DeepSeek-V3
fits one 8 x H200 node with room to spare (sized from the shapes and, for the experts, on the meta
device: no memory is allocated); dequantised to bf16 it would not. The CUDA branch (a block-scaled
FP8 GEMM) cannot run here: its argument layouts are checked against torch's own checks on the meta
device, and its numerics emulated on the CPU.
"""
from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F

from asap.engine.reference import run_batch
from asap.model import fp8
from asap.model.config import ModelConfig
from asap.model.fp8 import BlockFp8Weight, fp8_linear, quantize_activations_1x128
from asap.model.layers import linear
from asap.model.loader import empty_expert_shard, load_attention_side, load_expert_shard
from asap.model.materialize import materialize
from asap.model.presets import PRESETS
from asap.model.quant import QuantConfig, dequantize, quantizable, quantize
from asap.model.tensors import attention_side_tensors
from safetensors import safe_open

H200_BYTES = 141e9
GPUS = 8
_ROUTER = ("mlp.gate.weight", "e_score_correction_bias")


def _attention_bytes(cfg: ModelConfig, act_bytes: int, fp8: bool) -> int:
    """The attention side as the loader holds it: the router in float32; with fp8 every block-FP8 linear
    weight (asap.model.quant.quantizable, what DeepSeek-V3 ships in FP8) at 1 byte a weight plus a float32
    scale a block; everything else at act_bytes."""
    bo, bi = cfg.quant.block if fp8 else (1, 1)
    total = 0
    for name, shape in attention_side_tensors(cfg).items():
        if name.endswith(_ROUTER):
            total += 4 * math.prod(shape)
        elif fp8 and quantizable(name, shape):
            total += math.prod(shape) + 4 * -(-shape[0] // bo) * -(-shape[1] // bi)
        else:
            total += act_bytes * math.prod(shape)
    return total


def _per_gpu_bytes(cfg: ModelConfig, fp8: bool) -> tuple[int, int]:
    """(attention side, one GPU's 1/8 of the routed experts) in bf16, or block-FP8 where the checkpoint is,
    under EP8 with the attention side on every GPU (the sync engine's layout; the async one holds less)."""
    per = cfg.num_experts // GPUS
    shard = empty_expert_shard(cfg, {l: list(range(per)) for l in cfg.moe_layer_ids}, torch.bfloat16, "meta", fp8)
    assert all(t.device.type == "meta" for t in shard.gate_up.values())
    return _attention_bytes(cfg, 2, fp8), shard.nbytes()


def test_deepseek_v3_fits_eight_h200_with_fp8_weights():
    cfg = dataclasses.replace(ModelConfig.from_hf(PRESETS["deepseek-v3"]), quant=QuantConfig(block=(128, 128)))
    attention, experts = _per_gpu_bytes(cfg, fp8=True)
    assert experts == cfg.num_params()["experts"] // GPUS + sum(          # 1 byte a weight + the block scales
        4 * (2 * 16 * 56 + 56 * 16) * 32 for _ in cfg.moe_layer_ids)
    bf16_attention, bf16_experts = _per_gpu_bytes(cfg, fp8=False)
    total = attention + experts
    print(f"DeepSeek-V3 per GPU (EP8, attention side on every GPU): attention {attention / 1e9:.2f} GB FP8 "
          f"(bf16: {bf16_attention / 1e9:.2f}) + experts {experts / 1e9:.2f} GB = {total / 1e9:.2f} GB "
          f"of {H200_BYTES / 1e9:.0f} GB ({total / H200_BYTES:.0%}; experts only in FP8: "
          f"{(bf16_attention + experts) / 1e9:.2f} GB)")
    assert round(total / 1e9, 2) == 101.05 and round(bf16_attention / 1e9, 2) == 34.45   # computed, not measured
    assert attention < 0.6 * bf16_attention               # the attention side is FP8 too: ~15 GB saved a GPU
    assert total < 0.75 * H200_BYTES, f"{total / 1e9:.1f} GB per GPU"   # >= 25% left for KV and activations
    assert bf16_attention + bf16_experts > H200_BYTES     # the old layout (all dequantised) did not fit


def test_an_fp8_shard_is_stored_fp8_and_computes_as_dequantised_at_load(tmp_path):
    path = materialize("tiny-deepseek-v3", tmp_path / "fp8", fp8_block=(16, 16))
    shard = load_expert_shard(path, [2, 7], dtype=torch.float32)
    cfg = ModelConfig.from_dir(path)
    layer = cfg.moe_layer_ids[0]
    assert shard.gate_up[layer].dtype == shard.down[layer].dtype == torch.float8_e4m3fn
    gu, dn = shard.weights(layer)
    index = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]

    def read(name):
        with safe_open(path / index[name], "pt") as f:
            return f.get_tensor(name)

    for slot, e in enumerate([2, 7]):
        p = f"model.layers.{layer}.mlp.experts.{e}."
        deq = {k: dequantize(read(p + k + "_proj.weight"), read(p + k + "_proj.weight_scale_inv"), (16, 16),
                             torch.float32) for k in ("gate", "up", "down")}
        assert torch.equal(gu[slot], torch.cat((deq["gate"], deq["up"])))   # bit for bit
        assert torch.equal(dn[slot], deq["down"])
    # Resident: 1 byte a weight plus the scales, a quarter of the float32 shard's size.
    full = load_expert_shard(materialize("tiny-deepseek-v3", tmp_path / "plain"), [2, 7], dtype=torch.float32)
    assert shard.nbytes() < 0.3 * full.nbytes()


def _logits(side, shard, dtype=torch.float32):
    prompts = {0: list(range(1, 70)), 1: list(range(7, 40)), 2: [5]}
    outs = run_batch(side, [shard], prompts, dtype, "cpu", {0: 3})
    return [outs[i].logits for i in sorted(outs)], outs[0].prompt_logprobs.token_logprobs


@pytest.mark.parametrize("preset,block", [("tiny-deepseek-v3", (16, 16)), ("tiny-qwen3-moe", (16, 24))])
def test_fp8_attention_side_stays_fp8_and_gives_the_dequantised_at_load_logits(preset, block, tmp_path):
    """Attention projections, shared experts and dense MLPs load as float8 + float32 scales (the fused gate_up
    too); the logits are those of the old dequantise-at-load layout bit for bit (16x24: partial blocks)."""
    path = materialize(preset, tmp_path / "fp8", fp8_block=block)
    side = load_attention_side(path, torch.float32)
    old = load_attention_side(path, torch.float32, keep_fp8=False)
    cfg = side.cfg
    for i, layer in enumerate(side.layers):
        names = {n.removeprefix(f"model.layers.{i}.") for n, s in attention_side_tensors(cfg).items()
                 if n.startswith(f"model.layers.{i}.") and quantizable(n, s)}
        fused = {n for n in names if n.endswith(("gate_proj.weight", "up_proj.weight"))}
        want = (names - fused) | {n.rsplit(".", 2)[0] + ".gate_up" for n in fused}
        assert want and {n for n, w in layer.items() if isinstance(w, BlockFp8Weight)} == want
        for n in want:
            w = layer[n]
            assert w.weight.dtype == torch.float8_e4m3fn and w.scale_inv.dtype == torch.float32
            assert w.block == block and tuple(w.shape) == tuple(old.layers[i][n].shape)
            assert torch.equal(w.dequantize(torch.float32), old.layers[i][n])
        assert not any(isinstance(w, BlockFp8Weight) for n, w in old.layers[i].items())
    assert side.embed.dtype == side.norm.dtype == torch.float32 and layer["mlp.gate.weight"].dtype == torch.float32
    assert side.nbytes() == _attention_bytes(cfg, 4, fp8=True)       # the layout the DeepSeek-V3 sizing counts
    assert old.nbytes() == _attention_bytes(cfg, 4, fp8=False)
    shard = load_expert_shard(path, range(cfg.num_experts), torch.float32)
    (new_logits, new_lp), (old_logits, old_lp) = _logits(side, shard), _logits(old, shard)
    assert all(torch.equal(a, b) for a, b in zip(new_logits, old_logits)) and torch.equal(new_lp, old_lp)


def test_fp8_attention_side_in_bfloat16_matches_the_dequantised_at_load_one(tmp_path):
    path = materialize("tiny-deepseek-v3", tmp_path / "fp8", fp8_block=(16, 16))
    side, old = (load_attention_side(path, torch.bfloat16, keep_fp8=k) for k in (True, False))
    shard = load_expert_shard(path, range(side.cfg.num_experts), torch.bfloat16)
    for a, b in zip(_logits(side, shard, torch.bfloat16)[0], _logits(old, shard, torch.bfloat16)[0]):
        assert torch.equal(a, b)


def test_a_checkpoint_without_fp8_loads_as_before(tmp_path):
    path = materialize("tiny-deepseek-v3", tmp_path / "plain")
    side, old = (load_attention_side(path, torch.float32, keep_fp8=k) for k in (True, False))
    for a, b in zip(side.layers, old.layers):
        assert a.keys() == b.keys()
        assert all(type(a[n]) is torch.Tensor and torch.equal(a[n], b[n]) for n in a)


def _fp8_weight(out_f: int, in_f: int, block=(128, 128), seed: int = 0) -> BlockFp8Weight:
    g = torch.Generator().manual_seed(seed)
    return BlockFp8Weight(*quantize(0.02 * torch.randn(out_f, in_f, generator=g), block), block)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_linear_on_cpu_is_dequantise_then_linear(dtype):
    w = _fp8_weight(40, 56, (16, 24))                     # partial blocks on both edges
    x = torch.randn(2, 9, 56).to(dtype)
    bias = torch.randn(40).to(dtype)
    ref = F.linear(x, dequantize(w.weight, w.scale_inv, w.block, dtype), bias)
    assert torch.equal(linear(x, w, bias), ref) and torch.equal(fp8_linear(x, w, bias), ref)
    assert torch.equal(F.linear(x, w, bias), ref)          # callers outside the model math (kernel timing)
    assert tuple(w.shape) == (40, 56) and w.nbytes() == 40 * 56 + 4 * 3 * 3
    with pytest.raises(TypeError, match="block-FP8"):
        torch.matmul(x, w)


def test_gate_and_up_fuse_in_fp8_only_where_their_blocks_line_up():
    g, u = _fp8_weight(32, 24, (16, 24), 1), _fp8_weight(32, 24, (16, 24), 2)
    fused = BlockFp8Weight.cat_rows([g, u])
    assert torch.equal(fused.dequantize(torch.float32),
                       torch.cat([g.dequantize(torch.float32), u.dequantize(torch.float32)]))
    assert BlockFp8Weight.cat_rows([_fp8_weight(24, 24, (16, 24)), u]) is None     # gate ends mid-block
    from asap.model.loader import _cat_rows
    odd = _cat_rows([_fp8_weight(24, 24, (16, 24)), u], torch.float32)          # -> dequantised, as before
    assert isinstance(odd, torch.Tensor) and odd.shape == (56, 24)


def test_activations_quantised_per_1x128_group_emulate_the_block_scaled_gemm():
    """The CUDA branch's numerics, emulated on the CPU: x ~= q * scale per 1x128 group, and the GEMM of the
    dequantised operands stays within FP8's rounding of the dequantise-then-linear result."""
    x = torch.randn(37, 512) * torch.logspace(-2, 1, 512)      # groups of very different magnitudes
    x[3, :128] = 0                                             # an all-zero group
    q, scale = quantize_activations_1x128(x)
    assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape and scale.shape == (37, 4)
    back = (q.float().view(37, 4, 128) * scale[..., None]).view(37, 512)
    assert torch.equal(back[3, :128], torch.zeros(128))
    # e4m3 rounds to 3 mantissa bits (half an ulp: 2^-4 relative), subnormals to 2^-9 of the scale unit
    step = scale.repeat_interleave(128, 1)
    assert ((back - x).abs() <= x.abs() * 2**-4 + step * 2**-10).all()
    w = _fp8_weight(256, 512)
    emulated, ref = F.linear(back, w.dequantize(torch.float32)), fp8_linear(x, w)
    assert F.cosine_similarity(emulated.flatten(), ref.flatten(), dim=0) > 0.999


@pytest.mark.skipif(fp8.block_scaled_mm_api() is None, reason="this torch has no F.scaled_mm block-wise recipes")
@pytest.mark.parametrize("lead,k", [((7,), 512), ((2, 33), 640), ((1,), 128)])
def test_the_cuda_branch_passes_torchs_layout_checks_on_the_meta_device(lead, k):
    """Meta tensors run torch's checks for a CUDA scaled_mm (device_hint: cuda): shapes, strides, dtypes
    of both operands and both scales, the K-block padding to a multiple of 4 (640: 5 blocks -> 8)."""
    w = BlockFp8Weight(torch.empty(384, k, dtype=torch.float8_e4m3fn, device="meta"),
                       torch.empty(3, k // 128, device="meta"), (128, 128))
    l4 = -(-k // 128 // 4) * 4
    assert w.cublas_scale.shape == (l4, 3) and w.cublas_scale.stride() == (1, l4)
    x = torch.empty(*lead, k, dtype=torch.bfloat16, device="meta")
    out = fp8._scaled_mm_linear(x, w, torch.empty(384, dtype=torch.bfloat16, device="meta"))
    assert out.shape == (*lead, 384) and out.dtype == torch.bfloat16
    bad = BlockFp8Weight(w.weight, w.scale_inv, (128, 128))
    bad.__dict__["cublas_scale"] = w.scale_inv.t().contiguous()                 # K-blocks not padded / wrong stride
    if k // 128 % 4:
        with pytest.raises(RuntimeError):
            fp8._scaled_mm_linear(x, bad, None)


def test_the_cuda_branch_is_only_tried_where_it_can_run(monkeypatch):
    x = torch.randn(4, 512)
    assert not fp8._scaled_mm_applies(x, _fp8_weight(256, 512))                 # CPU: not in SCALED_MM_ON
    monkeypatch.setattr(fp8, "SCALED_MM_ON", {"cpu"})
    monkeypatch.setattr(fp8, "_capability", lambda device: (9, 0))
    if fp8.block_scaled_mm_api() is None:
        pytest.skip("this torch has no F.scaled_mm block-wise recipes")
    assert fp8._scaled_mm_applies(x, _fp8_weight(256, 512))
    assert not fp8._scaled_mm_applies(x, _fp8_weight(576, 512))                 # MLA's kv_a: 576 rows
    assert not fp8._scaled_mm_applies(x, _fp8_weight(256, 512, (16, 16)))
    assert not fp8._scaled_mm_applies(x.half(), _fp8_weight(256, 512))
    monkeypatch.setattr(fp8, "_capability", lambda device: (8, 9))
    assert not fp8._scaled_mm_applies(x, _fp8_weight(256, 512))


def test_a_refused_block_scaled_gemm_falls_back_once_and_never_crashes(monkeypatch):
    """CPU torch has no block-wise scaled_mm kernel: forcing the branch there shows the guard at work."""
    if fp8.block_scaled_mm_api() is None:
        pytest.skip("this torch has no F.scaled_mm block-wise recipes")
    monkeypatch.setattr(fp8, "SCALED_MM_ON", {"cpu"})
    monkeypatch.setattr(fp8, "SCALED_MM_FAILED", {})
    monkeypatch.setattr(fp8, "_capability", lambda device: (9, 0))
    w, x = _fp8_weight(256, 512), torch.randn(5, 512, dtype=torch.bfloat16)
    with pytest.warns(RuntimeWarning, match="block-scaled FP8 GEMM unavailable"):
        out = fp8_linear(x, w)
    assert torch.equal(out, F.linear(x, w.dequantize(torch.bfloat16)))
    assert torch.device("cpu") in fp8.SCALED_MM_FAILED and not fp8._scaled_mm_applies(x, w)


def test_a_full_device_is_an_error_not_a_reason_to_turn_the_fp8_gemm_off(monkeypatch):
    """Out of memory in the block-scaled GEMM propagates (the fallback would need more memory) and the
    GEMM stays on for the next call."""
    monkeypatch.setattr(fp8, "SCALED_MM_FAILED", {})
    monkeypatch.setattr(fp8, "_scaled_mm_applies", lambda x, w: True)

    def oom(x, w, bias):
        raise torch.OutOfMemoryError("CUDA out of memory")
    monkeypatch.setattr(fp8, "_scaled_mm_linear", oom)
    w, x = _fp8_weight(256, 512), torch.randn(5, 512, dtype=torch.bfloat16)
    with pytest.raises(torch.OutOfMemoryError):
        fp8_linear(x, w)
    assert fp8.SCALED_MM_FAILED == {}
