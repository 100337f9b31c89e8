"""GLM-4.5 / GLM-4.5-Air (`glm4_moe`, transformers' Glm4MoeForCausalLM).

GQA with partial rotary (the first partial_rotary_factor of each head), q/k/v
biases (attention_bias), optional q/k norms (use_qk_norm); DeepSeek-style
sigmoid routing with groups and a correction bias, shared experts, and
first_k_dense_replace leading dense layers.
"""
from __future__ import annotations

from asap.model.families.base import Fields, parse_common
from asap.model.families.gqa import GqaFamily

_COMMON = dict(
    model_type="glm4_moe", architectures=["Glm4MoeForCausalLM"], hidden_act="silu", rms_norm_eps=1e-5,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, partial_rotary_factor=0.5,
    attention_bias=True, norm_topk_prob=True, tie_word_embeddings=False,
)
PRESETS = {
    "tiny-glm4-moe": dict(
        _COMMON, vocab_size=512, hidden_size=64, num_hidden_layers=3, first_k_dense_replace=1,
        intermediate_size=128, moe_intermediate_size=32, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, use_qk_norm=True, n_routed_experts=16, num_experts_per_tok=4, n_shared_experts=1,
        n_group=4, topk_group=2, routed_scaling_factor=2.5, max_position_embeddings=4096,
    ),
    # GLM-4.5's head geometry (head_dim 128, half of it rotary, 12 query heads per KV head), narrower.
    "small-glm4-moe": dict(
        _COMMON, vocab_size=32000, hidden_size=1024, num_hidden_layers=8, first_k_dense_replace=1,
        intermediate_size=2816, moe_intermediate_size=512, num_attention_heads=24, num_key_value_heads=2,
        head_dim=128, use_qk_norm=True, n_routed_experts=32, num_experts_per_tok=8, n_shared_experts=1,
        n_group=1, topk_group=1, routed_scaling_factor=2.5, max_position_embeddings=16384,
    ),
    # Full size (config.json values; no weights are ever materialised for these).
    "glm-4.5": dict(
        _COMMON, vocab_size=151552, hidden_size=5120, num_hidden_layers=92, first_k_dense_replace=3,
        intermediate_size=12288, moe_intermediate_size=1536, num_attention_heads=96, num_key_value_heads=8,
        head_dim=128, use_qk_norm=True, n_routed_experts=160, num_experts_per_tok=8, n_shared_experts=1,
        n_group=1, topk_group=1, routed_scaling_factor=2.5, max_position_embeddings=131072,
        num_nextn_predict_layers=1,
    ),
    "glm-4.5-air": dict(
        _COMMON, vocab_size=151552, hidden_size=4096, num_hidden_layers=46, first_k_dense_replace=1,
        intermediate_size=10944, moe_intermediate_size=1408, num_attention_heads=96, num_key_value_heads=8,
        head_dim=128, use_qk_norm=False, n_routed_experts=128, num_experts_per_tok=8, n_shared_experts=1,
        n_group=1, topk_group=1, routed_scaling_factor=2.5, max_position_embeddings=131072,
        num_nextn_predict_layers=1,
    ),
}


class Glm4Moe(GqaFamily):
    model_type = "glm4_moe"
    architecture = "Glm4MoeForCausalLM"
    presets = PRESETS
    config_only = frozenset({"glm-4.5", "glm-4.5-air"})

    def parse(self, f: Fields) -> dict:
        kw = parse_common(f, default_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=131072)
        rope_raw = f.hf.get("rope_parameters") if isinstance(f.hf.get("rope_parameters"), dict) else {}
        prf = rope_raw.get("partial_rotary_factor", f.float("partial_rotary_factor", 0.5))
        if isinstance(prf, bool) or not isinstance(prf, (int, float)) or not 0 < prf <= 1:
            raise f.error("partial_rotary_factor", f"must be in (0, 1], got {prf!r}")
        L = kw["num_layers"]
        first_dense = f.int("first_k_dense_replace", 1, min=0)
        head_dim = f.int("head_dim", kw["hidden_size"] // kw["num_heads"])
        if int(head_dim * prf) % 2:
            raise f.error("partial_rotary_factor", f"{prf} x head_dim {head_dim} must be an even rotary dimension")
        return dict(
            kw, num_experts=f.int("n_routed_experts", None) or f.int("num_local_experts", None) or f.int("n_routed_experts"), scoring="sigmoid",
            moe_layers=tuple(i >= first_dense for i in range(L)),
            num_mtp_layers=f.int("num_nextn_predict_layers", 1, min=0),
            head_dim=head_dim, partial_rotary_factor=float(prf), attention_bias=f.bool("attention_bias", False),
            qk_norm=f.bool("use_qk_norm", False), n_shared_experts=f.int("n_shared_experts", 1, min=0),
            n_group=f.int("n_group", 1), topk_group=f.int("topk_group", 1),
            routed_scaling_factor=f.float("routed_scaling_factor", 1.0),
        )
