"""Model presets: HF `config.json` dicts.

`tiny-*` presets are for tests, `small-*` for CPU benchmarks (a few hundred
million parameters); the full-size ones carry the published config.json values
(../shared/REFERENCE.md) and are used by the simulator and cost model only.
Weights are never downloaded: `materialize` writes seeded random weights as a
real HF-format directory, so every code path goes through the same loader.
"""
from __future__ import annotations

_DSV3_COMMON = dict(
    model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], hidden_act="silu",
    rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    rope_interleave=True, norm_topk_prob=True, attention_bias=False, tie_word_embeddings=False,
)
_QWEN3_COMMON = dict(
    model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], hidden_act="silu",
    rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    norm_topk_prob=True, attention_bias=False, tie_word_embeddings=False,
    decoder_sparse_step=1, mlp_only_layers=[],
)

PRESETS: dict[str, dict] = {
    "tiny-deepseek-v3": dict(
        _DSV3_COMMON, vocab_size=512, hidden_size=64, num_hidden_layers=3, first_k_dense_replace=1,
        intermediate_size=128, moe_intermediate_size=32, num_attention_heads=4, num_key_value_heads=4,
        q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        n_routed_experts=16, num_experts_per_tok=4, n_shared_experts=1, n_group=4, topk_group=2,
        routed_scaling_factor=2.5, max_position_embeddings=4096,
    ),
    "tiny-qwen3-moe": dict(
        _QWEN3_COMMON, vocab_size=512, hidden_size=64, num_hidden_layers=3, intermediate_size=128,
        moe_intermediate_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_experts=16, num_experts_per_tok=4, max_position_embeddings=4096, mlp_only_layers=[0],
    ),
    # DeepSeek-V3's own per-head MLA geometry (qk 128+64, v 128, latent 512), narrower and shallower.
    # Like DeepSeek-V3 it routes each token to 8 experts, so the routed experts carry ~1.6x the FLOPs of
    # the attention side's projections and shared expert (DeepSeek-V3: 352M vs 231M MACs per token and
    # layer); that balance decides how attention and expert workers share the work.
    "small-deepseek-v3": dict(
        _DSV3_COMMON, vocab_size=32000, hidden_size=1024, num_hidden_layers=8, first_k_dense_replace=1,
        intermediate_size=2816, moe_intermediate_size=512, num_attention_heads=16, num_key_value_heads=16,
        q_lora_rank=384, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
        n_routed_experts=32, num_experts_per_tok=8, n_shared_experts=1, n_group=4, topk_group=2,
        routed_scaling_factor=2.5, max_position_embeddings=16384,
    ),
    "small-qwen3-moe": dict(
        _QWEN3_COMMON, vocab_size=32000, hidden_size=1024, num_hidden_layers=8, intermediate_size=2816,
        moe_intermediate_size=512, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
        num_experts=32, num_experts_per_tok=4, max_position_embeddings=16384,
    ),
    # Full-size configs (config.json values; no weights are ever materialised for these).
    "deepseek-v3": dict(
        _DSV3_COMMON, vocab_size=129280, hidden_size=7168, num_hidden_layers=61, first_k_dense_replace=3,
        intermediate_size=18432, moe_intermediate_size=2048, num_attention_heads=128, num_key_value_heads=128,
        q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
        n_routed_experts=256, num_experts_per_tok=8, n_shared_experts=1, n_group=8, topk_group=4,
        routed_scaling_factor=2.5, max_position_embeddings=163840,
    ),
    "qwen3-235b-a22b": dict(
        _QWEN3_COMMON, vocab_size=151936, hidden_size=4096, num_hidden_layers=94, intermediate_size=12288,
        moe_intermediate_size=1536, num_attention_heads=64, num_key_value_heads=4, head_dim=128,
        num_experts=128, num_experts_per_tok=8, max_position_embeddings=40960,
    ),
}
CONFIG_ONLY = {"deepseek-v3", "qwen3-235b-a22b"}


def preset_config(name: str) -> dict:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; available: {', '.join(PRESETS)}")
    return dict(PRESETS[name])
