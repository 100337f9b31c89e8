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
    def __init__(self, cost: CostModel, nic_per_copy: float = 0.0):
        self.cost = cost
        # An async expert worker's own combine traffic per row (emulated link; asap.workers.link): its GEMMs
        # and its NIC run side by side, the slower counting, as CostModel.expert_seconds charges them.
        self.nic_per_copy = nic_per_copy

    def attention_layer(self, chunks: list[tuple[int, int]], is_moe: bool) -> float:
        """One layer's attention stage for chunks of (num_new_tokens, context_before)."""
        return self.cost.chunks_seconds(is_moe, chunks) if chunks else 0.0

    def experts(self, num_pairs: int, num_experts_touched: int) -> float:
        """One expert worker's grouped GEMM over num_pairs token-expert rows (or its NIC, if slower)."""
        if not num_pairs:
            return 0.0
        return max(self.cost.expert_gemm_seconds(num_pairs, num_experts_touched), num_pairs * self.nic_per_copy)

    def head(self, num_rows: int) -> float:
        m = self.cost.model
        return self.cost.rates["attn_proj"].seconds(ops.lm_head_flops(m, num_rows),
                                                    m.hidden_size * m.vocab_size * self.cost.hw.weight_bytes)


def cost_table(cfg: ModelConfig, hardware: str, overlapped: bool = True) -> CostTable:
    """overlapped=False: comm never runs beside compute (sync without two-batch overlap), so compute keeps
    every core (CostModel(overlapped=...), as the simulator's sync engine builds it)."""
    from asap.cost.hardware import get_hardware
    return CostTable(CostModel(cfg, get_hardware(hardware), overlapped=overlapped))
