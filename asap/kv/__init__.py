"""Pulling a prefilled KV cache from `asap serve` (vLLM's kv_transfer_params convention), and handing
it to transformers.

    params = response.json()["kv_transfer_params"]        # asked for with {"do_remote_decode": true}
    kv = asap.kv.pull(params, base_url="http://prefill:8000")   # -> PulledKV (per-layer tensors + metadata);
                                                          # the API key goes to base_url only
    cache = asap.kv.to_transformers_cache(kv, hf_model.config)
    hf_model(next_ids, past_key_values=cache)
"""
from asap.kv.client import PulledKV, pull
from asap.kv.hf import to_transformers_cache

__all__ = ["PulledKV", "pull", "to_transformers_cache"]
