"""The per-op cost table behind emulated compute: the simulator's cost model, per worker call.

Emulated workers and the simulator answer "how long does this op take" from the
same asap.sim.cost.CostModel, which is what lets `asap sim validate` compare them.
"""
from __future__ import annotations

from asap.config import ModelConfig


class CostTable:
    def __init__(self, cost):
        self.cost = cost
        m = cost.model
        self._expert_params = 3 * m.hidden_size * m.moe_intermediate_size
        self._row_bytes = (2 * m.hidden_size + 3 * m.moe_intermediate_size) * 2

    def attention_layer(self, chunks: list[tuple[int, int]], is_moe: bool) -> float:
        """One layer's attention stage for chunks of (num_new_tokens, context_before)."""
        tokens = sum(n for n, _ in chunks)
        if tokens == 0:
            return 0.0
        pairs = sum(n * ctx + n * (n + 1) // 2 for n, ctx in chunks)
        kv = sum(n + ctx for n, ctx in chunks)
        return self.cost.attention_seconds(is_moe, tokens, pairs, kv)

    def experts(self, num_pairs: int, num_experts_touched: int) -> float:
        """One expert worker's grouped GEMM over num_pairs token-expert rows."""
        if num_pairs == 0:
            return 0.0
        hw = self.cost.hw
        rows = num_pairs + num_experts_touched * (hw.gemm_tile_m - 1) / 2
        return self.cost.rates["experts"].seconds(
            2 * rows * self._expert_params,
            num_experts_touched * self._expert_params * hw.weight_bytes + num_pairs * self._row_bytes)

    def head(self, num_rows: int) -> float:
        m = self.cost.model
        return self.cost.rates["attn_proj"].seconds(2 * num_rows * m.hidden_size * m.vocab_size,
                                                    m.hidden_size * m.vocab_size * self.cost.hw.weight_bytes)


def cost_table(cfg: ModelConfig, hardware: str) -> CostTable:
    from asap.sim.cost import CostModel
    from asap.sim.hardware import get_hardware
    return CostTable(CostModel(cfg, get_hardware(hardware)))
