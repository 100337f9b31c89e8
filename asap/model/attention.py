"""Causal prefill attention over a packed batch: MLA (DeepSeek-V3) and GQA (Qwen3-MoE, GLM-4.5).

The families (asap.model.families) bind these to a config, its RoPE table and
its softmax scale; biases and q/k norms are applied when the layer has them.

Shape legend: T packed tokens, n tokens of one chunk, Lk = start+n keys of its
request, H heads, Hkv kv heads, d head dim, r kv_lora_rank, R rope dim.
Weights `w` are one layer's tensors keyed by HF names without the
"model.layers.{i}." prefix; a projection weight is a tensor or a block-FP8
weight kept FP8 (asap.model.layers.linear runs both). Projections run once
over the packed batch; only the SDPA call runs per chunk (per request, never
per token).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from asap.model.config import ModelConfig
from asap.model.batch import Batch, KVCache
from asap.model.layers import Rotary, linear, rms_norm


# Device types where MLA's V is padded to the q/k head dim, and where masked GQA expands K/V (tests flip them).
PAD_V_ON = {"cpu"}
EXPAND_GQA_ON = {"cuda"}


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scale: float, gqa: bool = False):
    """q [H,n,d], k [Hk,Lk,d], v [Hk,Lk,dv] -> [n,H,dv]; causal with the chunk placed after `start` cached keys."""
    dv = v.shape[-1]
    if dv != q.shape[-1] and q.device.type in PAD_V_ON:
        # CPU flash attention needs equal head dims; padding V with zeros is exact and ~4x faster than the
        # math fallback MLA (qk 192 vs v 128) would otherwise take. On a GPU V stays unpadded (the fused
        # kernels there take another V width; benchmarks/gpu_check.py times both).
        v = F.pad(v, (0, q.shape[-1] - dv))
    if start and gqa and q.device.type in EXPAND_GQA_ON:
        # A mask and enable_gqa together leave only the math kernel on CUDA builds; expanded K/V (the same
        # numbers) let the fused masked kernel run. On a CPU the expansion measured slower: not done there.
        rep = q.shape[0] // k.shape[0]
        k, v, gqa = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0), False
    q, k, v = q[None], k[None], v[None]           # the fused kernels want a batch dim
    if start == 0:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
    else:
        n, lk = q.shape[2], k.shape[2]
        mask = torch.arange(lk, device=q.device)[None, :] <= (start + torch.arange(n, device=q.device))[:, None]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
    return out[0, ..., :dv].transpose(0, 1)


def mla(cfg: ModelConfig, rope: Rotary, scale: float, w: dict, x: torch.Tensor, batch: Batch, kv: KVCache,
        layer: int):
    H, dn, R, r, dv = cfg.num_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank, cfg.v_head_dim
    T = x.shape[0]
    if cfg.q_lora_rank:
        q = linear(rms_norm(linear(x, w["self_attn.q_a_proj.weight"], w.get("self_attn.q_a_proj.bias")),
                              w["self_attn.q_a_layernorm.weight"], cfg.rms_norm_eps), w["self_attn.q_b_proj.weight"])
    else:
        q = linear(x, w["self_attn.q_proj.weight"])
    q = q.view(T, H, dn + R)                                               # [T,H,dn+R]
    ckv = linear(x, w["self_attn.kv_a_proj_with_mqa.weight"], w.get("self_attn.kv_a_proj_with_mqa.bias"))  # [T,r+R]
    latent = rms_norm(ckv[:, :r], w["self_attn.kv_a_layernorm.weight"], cfg.rms_norm_eps)
    cos, sin = rope.cos_sin(batch.positions, x.dtype)
    q = torch.cat((q[..., :dn], rope.apply(q[..., dn:], cos, sin)), dim=-1)
    k_rope = rope.apply(ckv[:, None, r:], cos, sin)[:, 0]                   # [T,R], shared by all heads
    out = x.new_empty(T, H, dv)
    for c, rows in batch.segments():
        kv.write(c.request_id, layer, c.start, kv_latent=latent[rows], k_rope=k_rope[rows])
        cache = kv.read(c.request_id, layer, c.start + c.num_tokens)
        lk = cache["kv_latent"].shape[0]
        kvb = linear(cache["kv_latent"], w["self_attn.kv_b_proj.weight"]).view(lk, H, dn + dv)
        k = torch.cat((kvb[..., :dn], cache["k_rope"][:, None, :].expand(lk, H, R)), dim=-1)   # [Lk,H,dn+R]
        v = kvb[..., dn:]                                                                      # [Lk,H,dv]
        out[rows] = _sdpa(q[rows].transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), c.start, scale)
    return linear(out.reshape(T, -1), w["self_attn.o_proj.weight"], w.get("self_attn.o_proj.bias"))


def gqa(cfg: ModelConfig, rope: Rotary, scale: float, w: dict, x: torch.Tensor, batch: Batch, kv: KVCache,
        layer: int):
    H, Hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    T = x.shape[0]
    q = linear(x, w["self_attn.q_proj.weight"], w.get("self_attn.q_proj.bias")).view(T, H, d)
    k = linear(x, w["self_attn.k_proj.weight"], w.get("self_attn.k_proj.bias")).view(T, Hkv, d)
    v = linear(x, w["self_attn.v_proj.weight"], w.get("self_attn.v_proj.bias")).view(T, Hkv, d)
    if cfg.qk_norm:
        q = rms_norm(q, w["self_attn.q_norm.weight"], cfg.rms_norm_eps)
        k = rms_norm(k, w["self_attn.k_norm.weight"], cfg.rms_norm_eps)
    cos, sin = rope.cos_sin(batch.positions, x.dtype)
    q, k = rope.apply(q, cos, sin), rope.apply(k, cos, sin)
    out = x.new_empty(T, H, d)
    for c, rows in batch.segments():
        kv.write(c.request_id, layer, c.start, k=k[rows], v=v[rows])
        cache = kv.read(c.request_id, layer, c.start + c.num_tokens)
        out[rows] = _sdpa(q[rows].transpose(0, 1), cache["k"].transpose(0, 1), cache["v"].transpose(0, 1),
                          c.start, scale, gqa=H != Hkv)
    return linear(out.reshape(T, -1), w["self_attn.o_proj.weight"], w.get("self_attn.o_proj.bias"))
