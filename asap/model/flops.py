"""FLOPs of a prefill, counted from the config (matmuls and attention; elementwise ops ignored)."""
from __future__ import annotations

from asap.config import ModelConfig


def attention_flops(cfg: ModelConfig, num_tokens: int, context: int = 0) -> float:
    """One layer's attention for a chunk of num_tokens after `context` cached tokens (causal: ~L^2/2)."""
    D, H, n = cfg.hidden_size, cfg.num_heads, num_tokens
    keys = n * context + n * (n + 1) / 2                      # query-key pairs under the causal mask
    if cfg.is_mla:
        qk, dv, r, R = cfg.qk_head_dim, cfg.v_head_dim, cfg.kv_lora_rank, cfg.qk_rope_head_dim
        q = D * cfg.q_lora_rank + cfg.q_lora_rank * H * qk if cfg.q_lora_rank else D * H * qk
        proj = n * (q + D * (r + R) + H * dv * D) + (context + n) * r * H * (cfg.qk_nope_head_dim + dv)
        return 2 * proj + 2 * keys * H * (qk + dv)
    d, Hkv = cfg.head_dim, cfg.num_kv_heads
    return 2 * n * D * d * (2 * H + 2 * Hkv) + 2 * keys * H * 2 * d


def ffn_flops(cfg: ModelConfig, layer: int, num_tokens: int) -> float:
    """Dense MLP, or gate + shared experts + the top-k routed experts, of one layer."""
    D = cfg.hidden_size
    if not cfg.moe_layers[layer]:
        return 2 * num_tokens * 3 * D * cfg.intermediate_size
    inter = cfg.moe_intermediate_size
    return 2 * num_tokens * (D * cfg.num_experts + 3 * D * inter * (cfg.top_k + cfg.n_shared_experts))


def prefill_flops(cfg: ModelConfig, num_tokens: int) -> float:
    """Whole-model FLOPs of prefilling one prompt of num_tokens (LM head at the last position only)."""
    per_layer = sum(attention_flops(cfg, num_tokens) + ffn_flops(cfg, l, num_tokens) for l in range(cfg.num_layers))
    return per_layer + 2 * cfg.hidden_size * cfg.vocab_size
