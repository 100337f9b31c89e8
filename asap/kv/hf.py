"""A pulled KV cache as transformers' cache (DynamicCache), for its model's `past_key_values`.

transformers caches what ASAP computes, in [batch, heads, T, dim]:
DeepSeek-V3 (MLA) keeps the compressed latent: keys = kv_latent [1, 1, T, kv_lora_rank] (after
kv_a_layernorm), values = k_rope [1, 1, T, qk_rope_head_dim] (after RoPE); Qwen3-MoE (GQA) keeps
keys = k [1, H_kv, T, head_dim] (after k_norm and RoPE), values = v.
"""
from __future__ import annotations


def to_transformers_cache(kv, config, dtype=None):
    """kv: a PulledKV (or a list of per-layer dicts, as PrefillOutput.kv); config: the HF model's config."""
    from transformers import DynamicCache
    layers = getattr(kv, "layers", kv)
    cache = DynamicCache(config=config)
    for i, layer in enumerate(layers):
        if "kv_latent" in layer:
            keys, values = layer["kv_latent"][None, None], layer["k_rope"][None, None]
        elif "k" in layer:
            keys, values = layer["k"].transpose(0, 1)[None], layer["v"].transpose(0, 1)[None]
        else:
            raise ValueError(f"layer {i}: expected kv_latent/k_rope (MLA) or k/v (GQA), got {sorted(layer)}")
        if dtype is not None:
            keys, values = keys.to(dtype), values.to(dtype)
        cache.update(keys.contiguous(), values.contiguous(), i)
    return cache
