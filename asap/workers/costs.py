"""The per-op cost table behind emulated compute: the cost model, per worker call.

Emulated workers and the simulator answer "how long does this op take" from the
same asap.cost.CostModel and asap.cost.ops formulas, which is what lets
`asap sim validate` compare them.
"""
from __future__ import annotations

from asap.config import ModelConfig
from asap.cost import ops
from asap.cost.model import CostModel


class CostTable:
    def __init__(self, cost: CostModel):
        self.cost = cost

    def attention_layer(self, chunks: list[tuple[int, int]], is_moe: bool) -> float:
        """One layer's attention stage for chunks of (num_new_tokens, context_before)."""
        return self.cost.chunks_seconds(is_moe, chunks) if chunks else 0.0

    def experts(self, num_pairs: int, num_experts_touched: int) -> float:
        """One expert worker's grouped GEMM over num_pairs token-expert rows."""
        return self.cost.expert_gemm_seconds(num_pairs, num_experts_touched) if num_pairs else 0.0

    def head(self, num_rows: int) -> float:
        m = self.cost.model
        return self.cost.rates["attn_proj"].seconds(ops.lm_head_flops(m, num_rows),
                                                    m.hidden_size * m.vocab_size * self.cost.hw.weight_bytes)


def cost_table(cfg: ModelConfig, hardware: str) -> CostTable:
    from asap.cost.hardware import get_hardware
    return CostTable(CostModel(cfg, get_hardware(hardware)))
