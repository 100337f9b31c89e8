"""DeepSeek-V3 / R1 (`deepseek_v3`, transformers' DeepseekV3ForCausalLM): MLA attention, grouped sigmoid routing.

KV layout per token and layer: kv_latent [kv_lora_rank] (after kv_a_layernorm)
and k_rope [qk_rope_head_dim] (after RoPE), shared by all heads.
"""
from __future__ import annotations

from functools import partial

from asap.model import attention
from asap.model.families.base import AttentionCost, Family, Fields, parse_common
from asap.model.layers import Rotary
from asap.model.rope import yarn_mscale

_COMMON = dict(
    model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], hidden_act="silu",
    rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    rope_interleave=True, norm_topk_prob=True, attention_bias=False, tie_word_embeddings=False,
)
PRESETS = {
    "tiny-deepseek-v3": dict(
        _COMMON, vocab_size=512, hidden_size=64, num_hidden_layers=3, first_k_dense_replace=1,
        intermediate_size=128, moe_intermediate_size=32, num_attention_heads=4, num_key_value_heads=4,
        q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        n_routed_experts=16, num_experts_per_tok=4, n_shared_experts=1, n_group=4, topk_group=2,
        routed_scaling_factor=2.5, max_position_embeddings=4096,
    ),
    # DeepSeek-V3's own per-head MLA geometry (qk 128+64, v 128, latent 512), narrower and shallower.
    # Like DeepSeek-V3 it routes each token to 8 experts, so the routed experts carry ~1.6x the FLOPs of
    # the attention side's projections and shared expert (DeepSeek-V3: 352M vs 231M MACs per token and
    # layer); that balance decides how attention and expert workers share the work.
    "small-deepseek-v3": dict(
        _COMMON, vocab_size=32000, hidden_size=1024, num_hidden_layers=8, first_k_dense_replace=1,
        intermediate_size=2816, moe_intermediate_size=512, num_attention_heads=16, num_key_value_heads=16,
        q_lora_rank=384, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
        n_routed_experts=32, num_experts_per_tok=8, n_shared_experts=1, n_group=4, topk_group=2,
        routed_scaling_factor=2.5, max_position_embeddings=16384,
    ),
    # Full size (config.json values; no weights are ever materialised for it).
    "deepseek-v3": dict(
        _COMMON, vocab_size=129280, hidden_size=7168, num_hidden_layers=61, first_k_dense_replace=3,
        intermediate_size=18432, moe_intermediate_size=2048, num_attention_heads=128, num_key_value_heads=128,
        q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
        n_routed_experts=256, num_experts_per_tok=8, n_shared_experts=1, n_group=8, topk_group=4,
        routed_scaling_factor=2.5, max_position_embeddings=163840,
    ),
}


class DeepseekV3(Family):
    model_type = "deepseek_v3"
    architecture = "DeepseekV3ForCausalLM"
    presets = PRESETS
    config_only = frozenset({"deepseek-v3"})

    def parse(self, f: Fields) -> dict:
        kw = parse_common(f)
        f.require("scoring_func", ("sigmoid",), "sigmoid")
        f.require("topk_method", ("noaux_tc",), "noaux_tc", "DeepSeek-V3 routes with the correction bias")
        f.require("moe_layer_freq", (1,), 1)
        # Absent fields take transformers' DeepseekV3Config defaults (DeepSeek-V3's own values).
        first_dense = f.int("first_k_dense_replace", 3, min=0)
        q_lora = f.int("q_lora_rank", None) if "q_lora_rank" in f.hf else 1536    # null: no q LoRA
        L = kw["num_layers"]
        n_exp = f.int("n_routed_experts", None) or f.int("num_local_experts", None) or f.int("n_routed_experts")
        nope, rope_dim = f.int("qk_nope_head_dim"), f.int("qk_rope_head_dim")
        for key, derived in (("head_dim", rope_dim), ("qk_head_dim", nope + rope_dim)):   # transformers 5 writes these
            if f.get(key, derived) != derived:
                raise f.error(key, f"= {f.hf[key]!r} disagrees with the head dims (expected {derived})")
        return dict(
            kw, num_experts=n_exp, scoring="sigmoid", moe_layers=tuple(i >= first_dense for i in range(L)),
            num_mtp_layers=f.int("num_nextn_predict_layers", 1, min=0),
            q_lora_rank=q_lora, kv_lora_rank=f.int("kv_lora_rank"),
            qk_nope_head_dim=nope, qk_rope_head_dim=rope_dim,
            v_head_dim=f.int("v_head_dim"), rope_interleave=f.bool("rope_interleave", True),
            attention_bias=f.bool("attention_bias", False),
            n_shared_experts=f.int("n_shared_experts", 1, min=0), n_group=f.int("n_group", 8),
            topk_group=f.int("topk_group", 4), routed_scaling_factor=f.float("routed_scaling_factor", 2.5),
        )

    def softmax_scale(self, cfg) -> float:
        """(qk head dim)^-0.5, times YaRN's mscale^2 when the RoPE is scaled (transformers' yarn_apply_mscale)."""
        scale = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5
        m_all = cfg.rope.get("mscale_all_dim", 0)
        if cfg.rope.rope_type != "default" and m_all:
            factor = cfg.rope.get("factor") or cfg.max_position_embeddings / cfg.rope.get(
                "original_max_position_embeddings", cfg.max_position_embeddings)
            scale *= yarn_mscale(factor, m_all) ** 2
        return scale

    def build_attention(self, cfg, device):
        R = cfg.qk_rope_head_dim
        rope = Rotary(cfg.rope.inv_freq(R, cfg.max_position_embeddings), cfg.rope_interleave,
                      cfg.rope.attention_factor(cfg.max_position_embeddings), device)
        return partial(attention.mla, cfg, rope, self.softmax_scale(cfg))

    def kv_layout(self, cfg):
        return {"kv_latent": (cfg.kv_lora_rank,), "k_rope": (cfg.qk_rope_head_dim,)}

    def attention_tensors(self, cfg):
        D, H, r, R, q = cfg.hidden_size, cfg.num_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.q_lora_rank
        qk, a, bias = cfg.qk_nope_head_dim + R, "self_attn.", cfg.attention_bias
        s = {}
        if q:
            s.update({a + "q_a_proj.weight": (q, D), a + "q_a_layernorm.weight": (q,), a + "q_b_proj.weight": (H * qk, q)})
            if bias:
                s[a + "q_a_proj.bias"] = (q,)
        else:
            s[a + "q_proj.weight"] = (H * qk, D)
        s.update({a + "kv_a_proj_with_mqa.weight": (r + R, D), a + "kv_a_layernorm.weight": (r,),
                  a + "kv_b_proj.weight": (H * (cfg.qk_nope_head_dim + cfg.v_head_dim), r),
                  a + "o_proj.weight": (D, H * cfg.v_head_dim)})
        if bias:
            s.update({a + "kv_a_proj_with_mqa.bias": (r + R,), a + "o_proj.bias": (D,)})
        return s

    def attention_cost(self, cfg) -> AttentionCost:
        D, H, q, r, R = cfg.hidden_size, cfg.num_heads, cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_rope_head_dim
        dn, dv = cfg.qk_nope_head_dim, cfg.v_head_dim
        qk = dn + R
        q_proj = D * q + q * H * qk if q else D * H * qk
        proj = q_proj + D * (r + R) + H * dv * D
        params = sum(_numel(s) for s in self.attention_tensors(cfg).values())
        return AttentionCost(
            params=params, proj_params=proj, context_proj_params=r * H * (dn + dv),
            proj_act=2 * D + (q or 0) + H * qk + r + R + H * (dn + dv) + H * dv,
            heads=H, kv_heads=H, qk_head_dim=qk, v_head_dim=dv, kv_cache_elems=r + R, kv_layout="mla",
            token_weights=tuple(f"self_attn.{n}.weight" for n in (("q_a_proj", "q_b_proj") if q else ("q_proj",))
                                + ("kv_a_proj_with_mqa", "o_proj")),
            context_weights=("self_attn.kv_b_proj.weight",))


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
