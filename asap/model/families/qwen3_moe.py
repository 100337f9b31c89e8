"""Qwen3-MoE (`qwen3_moe`, transformers' Qwen3MoeForCausalLM): GQA with q/k norms, softmax top-k routing."""
from __future__ import annotations

from asap.model.families.base import Fields, parse_common
from asap.model.families.gqa import GqaFamily

_COMMON = dict(
    model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], hidden_act="silu",
    rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    norm_topk_prob=True, attention_bias=False, tie_word_embeddings=False,
    decoder_sparse_step=1, mlp_only_layers=[],
)
PRESETS = {
    "tiny-qwen3-moe": dict(
        _COMMON, vocab_size=512, hidden_size=64, num_hidden_layers=3, intermediate_size=128,
        moe_intermediate_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_experts=16, num_experts_per_tok=4, max_position_embeddings=4096, mlp_only_layers=[0],
    ),
    "small-qwen3-moe": dict(
        _COMMON, vocab_size=32000, hidden_size=1024, num_hidden_layers=8, intermediate_size=2816,
        moe_intermediate_size=512, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
        num_experts=32, num_experts_per_tok=4, max_position_embeddings=16384,
    ),
    # Full size (config.json values; no weights are ever materialised for it).
    "qwen3-235b-a22b": dict(
        _COMMON, vocab_size=151936, hidden_size=4096, num_hidden_layers=94, intermediate_size=12288,
        moe_intermediate_size=1536, num_attention_heads=64, num_key_value_heads=4, head_dim=128,
        num_experts=128, num_experts_per_tok=8, max_position_embeddings=40960,
    ),
}


class Qwen3Moe(GqaFamily):
    model_type = "qwen3_moe"
    architecture = "Qwen3MoeForCausalLM"
    presets = PRESETS
    config_only = frozenset({"qwen3-235b-a22b"})
    o_proj_bias = True

    def parse(self, f: Fields) -> dict:
        kw = parse_common(f, default_theta=10000.0, norm_topk_prob=False, max_position_embeddings=32768)
        if f.bool("use_sliding_window", False):
            raise f.error("use_sliding_window", "= true is not supported (sliding-window attention)")
        f.inert("sliding_window", "max_window_layers")    # read by transformers only with use_sliding_window
        L = kw["num_layers"]
        step, only = f.int("decoder_sparse_step", 1), set(f.int_list("mlp_only_layers"))
        n_exp = f.int("num_experts", None) or f.int("num_local_experts", None) or f.int("num_experts")
        return dict(
            kw, num_experts=n_exp, scoring="softmax",
            moe_layers=tuple(i not in only and (i + 1) % step == 0 for i in range(L)),
            head_dim=f.int("head_dim", kw["hidden_size"] // kw["num_heads"]),
            attention_bias=f.bool("attention_bias", False), qk_norm=True,
        )
