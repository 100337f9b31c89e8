"""FLOPs of a prefill, counted from the config (matmuls and attention; elementwise ops ignored).
The formulas are asap.cost.ops's, the ones the cost model and the simulator use."""
from __future__ import annotations

from asap.model.config import ModelConfig
from asap.cost.ops import attention_flops, ffn_flops, lm_head_flops

__all__ = ["attention_flops", "ffn_flops", "prefill_flops"]


def prefill_flops(cfg: ModelConfig, num_tokens: int) -> float:
    """Whole-model FLOPs of prefilling one prompt of num_tokens (LM head at the last position only)."""
    per_layer = sum(attention_flops(cfg, num_tokens) + ffn_flops(cfg, l, num_tokens) for l in range(cfg.num_layers))
    return per_layer + lm_head_flops(cfg)
