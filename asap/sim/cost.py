"""Per-op roofline cost model: seconds for each op of a prefill, as a breakdown.

Each op costs overhead + max(FLOPs / effective FLOP/s, bytes / effective bytes/s)
(asap.sim.hardware.OpRate). Compute rates lose `comm_compute_share` because both
engines overlap communication with compute all the time.

Attention side (one attention device, one layer, one micro-batch of chunks
(n new tokens, ctx tokens before the chunk)):
- attn_proj   all attention projections; 2 FLOPs per weight per token
- attn_core   causal attention over the context: n*ctx + n(n+1)/2 query-key pairs per
              chunk, so a whole prompt costs ~L^2/2. MLA prefill runs as plain MHA
              (q/k head dim 192, v 128); GQA reads its KV heads once
- gate, shared_expert (MoE layers) or dense_ffn (dense layers)
- elementwise norms, RoPE, residual adds, activation quantisation: ~12 passes over T x D
              BF16 per layer after the usual fusions (our estimate), memory-bound
Expert side (one batch of T tokens on a group of W expert workers):
- experts     grouped GEMM on the busiest worker: T*top_k*max_share token-expert rows
              (+ Poisson routing noise: the max of W counts of mean mu is ~mu + sqrt(2 ln W mu)),
              each expert padded to the GEMM row tile, weights of the experts touched loaded once
- expert_nic  that worker's combine bytes (an async expert worker overlaps its traffic with its GEMMs)
Communication (dispatch: token copies to experts; combine: back), per sender:
  latency + copies x seconds-per-copy, where a copy to a rank that already gets the
  token, or to the sender itself, is free, and across nodes a token crosses once per
  destination node, then is forwarded inside the node (DeepEP's scheme).

Shape legend: D hidden, H heads, E experts, k top-k, I expert width, T tokens.
"""
from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache

from asap.config import ModelConfig
from asap.scheduler.cost import CostFn, linear_cost
from asap.sim.experts import ExpertShares
from asap.sim.hardware import Hardware

ACT_BYTES = 2   # activations and KV in BF16
ELEMENTWISE_PASSES = 12


class CostModel:
    def __init__(self, model: ModelConfig, hw: Hardware):
        self.model, self.hw = model, hw
        keep = 1.0 - hw.comm_compute_share
        self.rates = {name: replace(r, flops_per_s=r.flops_per_s * keep) for name, r in hw.ops.items()}
        m, D = model, model.hidden_size
        if m.is_mla:
            H, q, kv, rope = m.num_heads, m.q_lora_rank, m.kv_lora_rank, m.qk_rope_head_dim
            dqk, dv, nope = m.qk_head_dim, m.v_head_dim, m.qk_nope_head_dim
            q_proj = D * q + q * H * dqk if q else D * H * dqk
            self.proj_params = q_proj + D * (kv + rope) + kv * H * (nope + dv) + H * dv * D
            self.proj_act = 2 * D + (q or 0) + H * dqk + kv + rope + H * (nope + dv) + H * dv   # elements per token
            self.core_flops_per_pair = 2 * H * (dqk + dv)          # QK^T and PV
            self.kv_bytes_per_ctx = H * (dqk + dv) * ACT_BYTES     # expanded K and V
            self.q_bytes_per_token = H * (dqk + dv) * ACT_BYTES    # Q in, O out
        else:
            H, Hkv, hd = m.num_heads, m.num_kv_heads, m.head_dim
            self.proj_params = D * hd * (H + 2 * Hkv) + H * hd * D
            self.proj_act = 2 * D + hd * (H + 2 * Hkv) + H * hd
            self.core_flops_per_pair = 4 * H * hd
            self.kv_bytes_per_ctx = 2 * Hkv * hd * ACT_BYTES
            self.q_bytes_per_token = 2 * H * hd * ACT_BYTES
        self.shared_params = 3 * D * m.moe_intermediate_size * m.n_shared_experts
        self.dense_params = 3 * D * m.intermediate_size
        self.expert_params = 3 * D * m.moe_intermediate_size
        self.moe_index = [-1] * m.num_layers        # layer -> position among MoE layers
        for i, layer in enumerate(m.moe_layer_ids):
            self.moe_index[layer] = i

    # ---- attention side ------------------------------------------------
    def attention_ops(self, is_moe: bool, num_tokens: int, num_pairs: int, num_kv: int) -> dict[str, float]:
        """One layer of one micro-batch: T new tokens, P causal query-key pairs, K context tokens read."""
        if num_tokens == 0:
            return {}
        m, D, T, r, wb = self.model, self.model.hidden_size, num_tokens, self.rates, self.hw.weight_bytes
        ops = {
            "elementwise": r["elementwise"].seconds(T * D, ELEMENTWISE_PASSES * T * D * ACT_BYTES),
            "attn_proj": r["attn_proj"].seconds(2 * T * self.proj_params,
                                                self.proj_params * wb + T * self.proj_act * ACT_BYTES),
            "attn_core": r["attn_core"].seconds(self.core_flops_per_pair * num_pairs,
                                                num_kv * self.kv_bytes_per_ctx + T * self.q_bytes_per_token),
        }
        if is_moe:
            ops["gate"] = r["gate"].seconds(2 * T * D * m.num_experts,
                                            D * m.num_experts * ACT_BYTES + T * D * ACT_BYTES)
            if self.shared_params:
                width = m.moe_intermediate_size * m.n_shared_experts
                ops["shared_expert"] = r["shared_expert"].seconds(
                    2 * T * self.shared_params, self.shared_params * wb + T * (2 * D + 3 * width) * ACT_BYTES)
        else:
            ops["dense_ffn"] = r["dense_ffn"].seconds(
                2 * T * self.dense_params, self.dense_params * wb + T * (2 * D + 3 * m.intermediate_size) * ACT_BYTES)
        return ops

    def attention_seconds(self, is_moe: bool, num_tokens: int, num_pairs: int, num_kv: int) -> float:
        return sum(self.attention_ops(is_moe, num_tokens, num_pairs, num_kv).values())

    # ---- expert side ----------------------------------------------------
    def expert_ops(self, moe_idx: int, num_tokens: float, shares: ExpertShares,
                   nic_per_copy: float = 0.0) -> dict[str, float]:
        """One MoE layer's routed experts for a batch of T tokens on `shares.num_workers` workers.
        With `nic_per_copy` (seconds per combined token copy) also the busiest worker's combine traffic."""
        if num_tokens <= 0:
            return {}
        m, W = self.model, shares.num_workers
        mu = num_tokens * m.top_k * shares.max_share[moe_idx]
        if W > 1:
            mu += math.sqrt(2 * math.log(W) * mu)
        touched = shares.slots * -math.expm1(-mu / shares.slots)      # expected experts with >= 1 row
        rows = mu + touched * (self.hw.gemm_tile_m - 1) / 2           # expected tile padding
        D, inter = m.hidden_size, m.moe_intermediate_size
        ops = {"experts": self.rates["experts"].seconds(
            2 * rows * self.expert_params,
            touched * self.expert_params * self.hw.weight_bytes + mu * (2 * D + 3 * inter) * ACT_BYTES)}
        if nic_per_copy:
            ops["expert_nic"] = mu * nic_per_copy
        return ops

    def expert_seconds(self, moe_idx: int, num_tokens: float, shares: ExpertShares,
                       nic_per_copy: float = 0.0) -> float:
        """GEMM time, or the slower of the GEMMs and the worker's own combine traffic, which an async
        expert worker overlaps with its GEMMs."""
        ops = self.expert_ops(moe_idx, num_tokens, shares, nic_per_copy)
        return max(ops.values()) if ops else 0.0

    # ---- communication ----------------------------------------------------
    def seconds_per_copy(self, num_ranks: int, local: bool, total_devices: int, elem_bytes: float) -> float:
        return _seconds_per_copy(self.hw.link, self.model.hidden_size, self.model.top_k, num_ranks, local,
                                 total_devices, elem_bytes)

    def comm_seconds(self, copies: float, per_copy: float) -> float:
        return self.hw.link.latency_s + copies * per_copy

    # ---- summaries --------------------------------------------------------
    def replica_cost_fn(self) -> CostFn:
        """Attention-side seconds for a batch on one replica, all layers, in the scheduler's
        linear form a + b*sum(n) + c*sum(n*(ctx+n)) (compute-bound slopes), for routing."""
        m, r = self.model, self.rates
        n_moe = sum(m.moe_layers)
        n_dense = m.num_layers - n_moe
        per_token = m.num_layers * 2 * self.proj_params / r["attn_proj"].flops_per_s \
            + n_moe * (2 * self.shared_params / r["shared_expert"].flops_per_s
                       + 2 * m.hidden_size * m.num_experts / r["gate"].flops_per_s) \
            + n_dense * 2 * self.dense_params / r["dense_ffn"].flops_per_s
        # n*(ctx+n) over-counts the causal n(n+1)/2 term by ~n^2/2; fine for ranking replicas.
        per_pair = m.num_layers * self.core_flops_per_pair / r["attn_core"].flops_per_s
        per_step = sum(len(self.attention_ops(moe, 1, 1, 1)) for moe in m.moe_layers) * r["attn_proj"].overhead_s
        return linear_cost(per_step, per_token, per_pair)

    def step_breakdown(self, chunks: list[tuple[int, int]], expert_tokens: int, shares: ExpertShares,
                       num_ranks: int, local: bool, total_devices: int) -> dict[str, float]:
        """Per-op seconds, summed over all layers and NOT overlapped, for one device running the
        chunks [(n, ctx), ...] while its experts' batch holds `expert_tokens` tokens (from all senders).
        For comparing with measured per-stage times line by line."""
        T = sum(n for n, _ in chunks)
        pairs = sum(n * ctx + n * (n + 1) // 2 for n, ctx in chunks)
        kv = sum(ctx + n for n, ctx in chunks)
        disp = self.seconds_per_copy(num_ranks, local, total_devices, self.hw.dispatch_bytes)
        comb = self.seconds_per_copy(num_ranks, local, total_devices, self.hw.combine_bytes)
        out: dict[str, float] = {}
        for layer, moe in enumerate(self.model.moe_layers):
            ops = self.attention_ops(moe, T, pairs, kv)
            if moe:
                ops.update(self.expert_ops(self.moe_index[layer], expert_tokens, shares))
                copies = max(T, expert_tokens * shares.max_share[self.moe_index[layer]]) * self.model.top_k
                ops["dispatch"] = self.comm_seconds(copies, disp)
                ops["combine"] = self.comm_seconds(copies, comb)
            for k, v in ops.items():
                out[k] = out.get(k, 0.0) + v
        return out


@lru_cache(maxsize=256)
def _seconds_per_copy(link, hidden: int, top_k: int, num_ranks: int, local: bool, total_devices: int,
                      elem_bytes: float) -> float:
    """Seconds per token copy (token x chosen expert) sent by one device to experts on `num_ranks` ranks.

    local: the sender is one of the ranks (sync EP), so copies to itself are free.
    """
    P, k = num_ranks, top_k
    token_bytes = hidden * elem_bytes
    ranks_hit = P * -math.expm1(k * math.log1p(-1 / P)) if P > 1 else 1.0     # distinct ranks per token
    if total_devices <= link.node_size:
        remote = (P - 1) / P if local else 1.0
        return ranks_hit * remote * token_bytes / link.intra_bytes_per_s / k
    S = min(link.node_size, P)
    nodes = max(1.0, P / S)
    nodes_hit = nodes * -math.expm1(k * math.log1p(-1 / nodes)) if nodes > 1 else 1.0
    cross = nodes_hit * ((nodes - 1) / nodes if local else 1.0) * token_bytes / link.inter_bytes_per_s
    forward = ranks_hit * (S - 1) / S * token_bytes / link.intra_bytes_per_s
    return max(cross, forward) / k
