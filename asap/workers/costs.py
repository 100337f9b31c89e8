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
    def __init__(self, cost: CostModel, nic_per_copy: float = 0.0, routing=None):
        self.cost = cost
        # Emulated routing (asap.cost.loads.TokenRouting: the simulator's load model, per token), or None:
        # uniform. Each (layer, call) of a worker gets its batch's drift keyed by its call count there.
        self.routing = routing
        self._calls: dict[int, int] = {}
        self._rngs: dict[int, object] = {}
        # An async expert worker's own combine traffic per row (emulated link; asap.workers.emulation.link): its GEMMs
        # and its NIC run side by side, the slower counting, as CostModel.expert_seconds charges them.
        self.nic_per_copy = nic_per_copy

    def attention_layer(self, chunks: list[tuple[int, int]], is_moe: bool) -> float:
        """One layer's attention stage for chunks of (num_new_tokens, context_before)."""
        return self.cost.chunks_seconds(is_moe, chunks) if chunks else 0.0

    def experts(self, num_pairs: int, num_experts_touched: int) -> float:
        """One expert worker's grouped GEMM over num_pairs token-expert rows (or its NIC, if slower). A worker
        that stands for g devices (a sync rank of a TP group: CostModel.rank_devices) spreads them over its g."""
        if not num_pairs:
            return 0.0
        g = self.cost.rank_devices
        gemm = self.cost.expert_gemm_seconds(num_pairs / g, max(1.0, num_experts_touched / g))
        return max(gemm, num_pairs * self.nic_per_copy)

    def route(self, layer: int, num_tokens: int, stream: int):
        """(num_tokens, top_k) expert ids of one batch at `layer`, drawn from `routing` (numpy), or None when
        there is no routing model. `stream`: the worker's own seed for its tokens' draws."""
        if self.routing is None:
            return None
        import numpy as np
        moe_idx = self.cost.moe_index[layer]
        n = self._calls.get(moe_idx, 0)
        self._calls[moe_idx] = n + 1
        rng = self._rngs.get(stream)
        if rng is None:
            rng = self._rngs[stream] = np.random.default_rng([self.routing.load.seed, 0x70, stream])
        return self.routing.route(moe_idx, num_tokens, (n,), rng)

    def head(self, num_rows: int) -> float:
        m = self.cost.model
        return self.cost.rates["attn_proj"].seconds(ops.lm_head_flops(m, num_rows),
                                                    m.hidden_size * m.vocab_size * self.cost.hw.weight_bytes)


def cost_table(cfg: ModelConfig, hardware: str, routing=None, **options) -> CostTable:
    """options: CostModel's attn_tp, rank_devices, overlapped; routing: asap.cost.loads.TokenRouting or None."""
    from asap.cost.hardware import get_hardware
    return CostTable(CostModel(cfg, get_hardware(hardware), **options), routing=routing)


def default_routing(cfg: ModelConfig):
    """The simulator's default load model (asap.sim.experts.load_model's defaults, read from asap.cost.loads:
    drawn, the calibrated skew) as per-token routing, uniform dataset popularity; None in expected mode."""
    from asap.cost.loads import DEFAULT_LOAD, TokenRouting
    return TokenRouting(cfg, DEFAULT_LOAD) if DEFAULT_LOAD.mode == "drawn" else None


def runtime_cost_table(cfg: ModelConfig, rt, engine: str, tp: int | None = None) -> CostTable:
    """The cost table an engine's emulated workers wait on, with the options the simulator builds the same
    engine with (asap.sim.run.build_engine): sync, one rank per DP group of attention_tp devices, compute
    sharing the cores with comm only under two-batch overlap; async, attention_tp per replica (tp: a fleet's
    replica's own)."""
    tp = rt.attention_tp if tp is None else tp
    routing = default_routing(cfg)
    if engine == "sync":
        return cost_table(cfg, rt.hardware, routing, attn_tp=tp, rank_devices=tp, overlapped=rt.microbatches > 1)
    return cost_table(cfg, rt.hardware, routing, attn_tp=tp)
