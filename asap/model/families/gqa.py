"""The grouped-query attention both Qwen3-MoE and GLM-4.5 use, parameterised by what differs between them.

KV layout per token and layer: k [num_kv_heads, head_dim] (after k_norm and
RoPE) and v [num_kv_heads, head_dim]. RoPE rotates the first
partial_rotary_factor * head_dim channels (rotate-half pairing).
"""
from __future__ import annotations

from functools import partial

from asap.model import attention
from asap.model.families.base import AttentionCost, Family
from asap.model.layers import Rotary


class GqaFamily(Family):
    o_proj_bias = False             # whether attention_bias also puts a bias on o_proj

    def rotary_dim(self, cfg) -> int:
        return int(cfg.head_dim * cfg.partial_rotary_factor)

    def build_attention(self, cfg, device):
        rope = Rotary(cfg.rope.inv_freq(self.rotary_dim(cfg), cfg.max_position_embeddings), False,
                      cfg.rope.attention_factor(cfg.max_position_embeddings), device)
        return partial(attention.gqa, cfg, rope, cfg.head_dim ** -0.5)

    def kv_layout(self, cfg):
        return {"k": (cfg.num_kv_heads, cfg.head_dim), "v": (cfg.num_kv_heads, cfg.head_dim)}

    def attention_tensors(self, cfg):
        D, H, Hkv, d, a = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, "self_attn."
        s = {a + "q_proj.weight": (H * d, D), a + "k_proj.weight": (Hkv * d, D), a + "v_proj.weight": (Hkv * d, D),
             a + "o_proj.weight": (D, H * d)}
        if cfg.attention_bias:
            s.update({a + "q_proj.bias": (H * d,), a + "k_proj.bias": (Hkv * d,), a + "v_proj.bias": (Hkv * d,)})
            if self.o_proj_bias:
                s[a + "o_proj.bias"] = (D,)
        if cfg.qk_norm:
            s.update({a + "q_norm.weight": (d,), a + "k_norm.weight": (d,)})
        return s

    def attention_cost(self, cfg) -> AttentionCost:
        D, H, Hkv, d = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        params = 0
        for shape in self.attention_tensors(cfg).values():
            n = 1
            for s in shape:
                n *= s
            params += n
        return AttentionCost(
            params=params, proj_params=D * d * (H + 2 * Hkv) + H * d * D, context_proj_params=0,
            proj_act=2 * D + d * (H + 2 * Hkv) + H * d, heads=H, kv_heads=Hkv, qk_head_dim=d, v_head_dim=d,
            kv_cache_elems=2 * Hkv * d, kv_layout="gqa",
            token_weights=tuple(f"self_attn.{p}_proj.weight" for p in "qkvo"))
