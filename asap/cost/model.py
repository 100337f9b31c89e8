"""Per-op roofline cost model: seconds for each op of a prefill, as a breakdown.

Each op costs overhead + max(FLOPs / effective FLOP/s, bytes / effective bytes/s)
(asap.cost.hardware.OpRate); the work of each op comes from asap.cost.ops.

Overlap and contention: while communication kernels overlap compute (two-batch overlap,
an async worker that sends while it computes) they take `comm_compute_share` of the
compute units (DeepEP: 24 of 132 SMs), so compute rates drop by that share. An engine
whose comm runs alone (no overlap) gets the full rates: `overlapped=False`.

Attention side (one engine rank, one layer, one micro-batch: n new tokens, ctx before):
- attn_proj   all attention projections; 2 FLOPs per weight per token
- attn_core   causal attention: n*ctx + n(n+1)/2 query-key pairs per chunk (~L^2/2 a prompt)
- gate, shared_expert (MoE layers) or dense_ffn (dense layers)
- elementwise norms, RoPE, residual adds, quantisation: memory-bound passes over T x D
- attn_tp     with attention tensor parallelism tp > 1: every op above but elementwise runs
              1/tp of its FLOPs and bytes on each of the tp devices (heads and weights split), and
              the activations are all-reduced once per MoE layer (reduce-scatter before dispatch,
              all-gather after combine) and twice per dense layer.
Expert side (one batch of T tokens on a group of W expert workers):
- experts     grouped GEMM on the busiest worker (asap.cost.ops: routing noise, tile padding)
- expert_act  the permute / SwiGLU+quantise / un-permute kernels around it: memory-bound, their own kernels
- expert_nic  that worker's combine bytes (an async expert worker overlaps its traffic with its GEMMs)

An engine rank may stand for a group of `rank_devices` devices (sync DP x TP: one DP group
of tp devices is one rank of the engine): its experts are spread over those devices and its
link carries rank_devices times one device's traffic.

Shape legend: D hidden, H heads, E experts, k top-k, I expert width, T tokens.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from asap.config import ModelConfig
from asap.cost import comm, ops
from asap.cost.hardware import Hardware
from asap.cost.shares import ExpertShares
from asap.scheduler.cost import CostFn, linear_cost

ACT_BYTES = ops.ACT_BYTES
ELEMENTWISE_PASSES = ops.ELEMENTWISE_PASSES


class CostModel:
    def __init__(self, model: ModelConfig, hw: Hardware, *, attn_tp: int = 1, rank_devices: int = 1,
                 overlapped: bool = True):
        if attn_tp < 1 or rank_devices < 1:
            raise ValueError(f"attn_tp and rank_devices must be >= 1, got {attn_tp}, {rank_devices}")
        if attn_tp > hw.link.node_size:
            raise ValueError(f"attention TP {attn_tp} spans more than one {hw.name} node ({hw.link.node_size})")
        self.model, self.hw = model, hw
        self.attn_tp, self.rank_devices, self.overlapped = attn_tp, rank_devices, overlapped
        keep = 1.0 - hw.comm_compute_share if overlapped else 1.0
        self.comm_keep = 1.0 - hw.comm_contention if overlapped else 1.0
        self.rates = {name: replace(r, flops_per_s=r.flops_per_s * keep) for name, r in hw.ops.items()}
        self.shape = ops.attention_shape(model)
        s = self.shape
        self.proj_params, self.proj_act = s.proj_params, s.proj_act
        self.core_flops_per_pair = s.core_flops_per_pair
        self.kv_bytes_per_ctx, self.q_bytes_per_token = s.kv_bytes_per_ctx, s.q_bytes_per_token
        self.shared_params = ops.shared_params(model)
        self.dense_params = ops.dense_params(model)
        self.expert_params = ops.expert_params(model)
        self.moe_index = [-1] * model.num_layers        # layer -> position among MoE layers
        for i, layer in enumerate(model.moe_layer_ids):
            self.moe_index[layer] = i

    def with_options(self, **kw) -> "CostModel":
        """The same model and hardware with other attn_tp / rank_devices / overlapped."""
        opts = dict(attn_tp=self.attn_tp, rank_devices=self.rank_devices, overlapped=self.overlapped, **kw)
        return CostModel(self.model, self.hw, **opts)

    # ---- attention side ------------------------------------------------
    def attention_ops(self, is_moe: bool, num_tokens: int, num_pairs: int, num_kv: int) -> dict[str, float]:
        """One layer of one micro-batch: T new tokens, P causal query-key pairs, K context tokens read."""
        if num_tokens == 0:
            return {}
        m, D, T, r, wb, tp = self.model, self.model.hidden_size, num_tokens, self.rates, self.hw.weight_bytes, \
            self.attn_tp
        # Under TP the tokens are scattered over the tp devices between attention and the MLP (reduce-scatter /
        # all-gather), so about half of the elementwise passes run on T / tp tokens.
        ew = ELEMENTWISE_PASSES * T * D * ACT_BYTES * (0.5 + 0.5 / tp)
        ops_ = {
            "elementwise": r["elementwise"].seconds(T * D, ew),
            "attn_proj": r["attn_proj"].seconds(2 * T * self.proj_params / tp,
                                                (self.proj_params * wb + T * self.proj_act * ACT_BYTES) / tp),
            "attn_core": r["attn_core"].seconds(self.core_flops_per_pair * num_pairs / tp,
                                                (num_kv * self.kv_bytes_per_ctx + T * self.q_bytes_per_token) / tp),
        }
        if is_moe:
            E = m.num_experts
            ops_["gate"] = r["gate"].seconds(2 * T * D * E / tp, (D * E + T * D) * ACT_BYTES / tp)
            if self.shared_params:
                width = m.moe_intermediate_size * m.n_shared_experts
                ops_["shared_expert"] = r["shared_expert"].seconds(
                    2 * T * self.shared_params / tp,
                    (self.shared_params * wb + T * ops.ffn_row_bytes(m, width)) / tp)
        else:
            ops_["dense_ffn"] = r["dense_ffn"].seconds(
                2 * T * self.dense_params / tp,
                (self.dense_params * wb + T * ops.ffn_row_bytes(m, m.intermediate_size)) / tp)
        if tp > 1:
            ops_["attn_tp"] = (1 if is_moe else 2) * comm.allreduce_seconds(self.hw.link, T, D, tp)
        return ops_

    def attention_seconds(self, is_moe: bool, num_tokens: int, num_pairs: int, num_kv: int) -> float:
        return sum(self.attention_ops(is_moe, num_tokens, num_pairs, num_kv).values())

    def chunks_seconds(self, is_moe: bool, chunks) -> float:
        """attention_seconds of chunks [(n, ctx), ...]."""
        return self.attention_seconds(is_moe, *ops.chunk_work(chunks))

    # ---- expert side ----------------------------------------------------
    def expert_gemm_seconds(self, rows: float, touched: float) -> float:
        """One device's routed experts over `rows` token-expert rows on `touched` experts: the grouped GEMMs
        plus the memory-bound kernels around them (expert_act)."""
        return sum(self._expert_compute(rows, touched).values())

    def _expert_compute(self, rows: float, touched: float) -> dict[str, float]:
        flops, nbytes = ops.expert_gemm_work(self.model, rows, touched, self.hw.gemm_tile_m, self.hw.weight_bytes)
        act = rows * ops.expert_act_bytes(self.model)
        return {"experts": self.rates["experts"].seconds(flops, nbytes),
                "expert_act": self.rates["elementwise"].seconds(0.0, act)}

    def expert_ops(self, moe_idx: int, num_tokens: float, shares: ExpertShares,
                   nic_per_copy: float = 0.0) -> dict[str, float]:
        """One MoE layer's routed experts for a batch of T tokens on `shares.num_workers` workers (each a
        group of rank_devices devices). With `nic_per_copy` (seconds per combined token copy) also the
        busiest worker's combine traffic."""
        if num_tokens <= 0:
            return {}
        g = self.rank_devices
        mu = ops.busiest_rows(num_tokens * self.model.top_k * shares.max_share[moe_idx] / g,
                              shares.num_workers * g)
        touched = ops.touched_experts(mu, max(1.0, shares.slots / g))
        out = self._expert_compute(mu, touched)
        if nic_per_copy:
            out["expert_nic"] = mu * nic_per_copy
        return out

    def expert_seconds(self, moe_idx: int, num_tokens: float, shares: ExpertShares,
                       nic_per_copy: float = 0.0) -> float:
        """GEMM time, or the slower of the GEMMs and the worker's own combine traffic, which an async
        expert worker overlaps with its GEMMs."""
        out = self.expert_ops(moe_idx, num_tokens, shares, nic_per_copy)
        return max(out.get("experts", 0.0) + out.get("expert_act", 0.0), out.get("expert_nic", 0.0))

    def batch_expert_seconds(self, moe_idx: int, num_tokens: float, shares: ExpertShares,
                             nic_per_copy: float = 0.0) -> float:
        """One expert batch on the pool of `shares.num_workers` workers: its busiest worker, from this
        batch's drawn loads where `shares` has draws (asap.cost.loads), else `expert_seconds` (expected)."""
        if shares.draws is None:
            return self.expert_seconds(moe_idx, num_tokens, shares, nic_per_copy)
        if num_tokens <= 0:
            return 0.0
        g = self.rank_devices
        mu = shares.draws.max_rows(moe_idx, num_tokens) / g
        if mu <= 0:
            return 0.0
        out = self._expert_compute(mu, ops.touched_experts(mu, max(1.0, shares.slots / g)))
        return max(out["experts"] + out["expert_act"], mu * nic_per_copy)

    def alltoall_rows(self, moe_idx: int, num_tokens: float, shares: ExpertShares):
        """A sync all-to-all's drawn rows per rank (numpy), or None where `shares` has no draws."""
        return None if shares.draws is None else shares.draws.rows(moe_idx, num_tokens)

    def worker_expert_seconds(self, rows, slots: int, nic_per_copy: float = 0.0):
        """Seconds of each worker (a scalar or a numpy array of workers) that got `rows` token-expert rows
        on `slots` expert copies: its GEMMs and the kernels around them (or its combine traffic, if slower).
        A worker that stands for rank_devices devices spreads its rows over them."""
        g = self.rank_devices
        mu = np.asarray(rows, dtype=float) / g
        touched = max(1.0, slots / g) * -np.expm1(-mu / max(1.0, slots / g))
        flops, nbytes = ops.expert_gemm_work(self.model, mu, touched, self.hw.gemm_tile_m, self.hw.weight_bytes)
        out = _rate_seconds(self.rates["experts"], flops, nbytes) \
            + _rate_seconds(self.rates["elementwise"], 0.0, mu * ops.expert_act_bytes(self.model))
        if nic_per_copy:
            out = np.maximum(out, mu * nic_per_copy)
        return np.where(mu > 0, out, 0.0)

    # ---- communication ----------------------------------------------------
    def seconds_per_copy(self, num_ranks: int, local: bool, total_devices: int, elem_bytes: float) -> float:
        """Per token copy sent by one engine rank (a group of rank_devices devices, each sending its share)."""
        g = self.rank_devices
        return comm.seconds_per_copy(self.hw.link, self.model.hidden_size, self.model.top_k, num_ranks * g, local,
                                     total_devices * g, elem_bytes) / g / self.comm_keep

    def comm_seconds(self, copies: float, per_copy: float) -> float:
        return self.hw.link.latency_s + copies * per_copy

    # ---- summaries --------------------------------------------------------
    def replica_cost_fn(self) -> CostFn:
        """Attention-side seconds for a batch on one replica, all layers, in the scheduler's
        linear form a + b*sum(n) + c*sum(n*(ctx+n)) (compute-bound slopes), for routing."""
        m, r, tp = self.model, self.rates, self.attn_tp
        n_moe = sum(m.moe_layers)
        n_dense = m.num_layers - n_moe
        per_token = (m.num_layers * 2 * self.proj_params / r["attn_proj"].flops_per_s
                     + n_moe * (2 * self.shared_params / r["shared_expert"].flops_per_s
                                + 2 * m.hidden_size * m.num_experts / r["gate"].flops_per_s)
                     + n_dense * 2 * self.dense_params / r["dense_ffn"].flops_per_s) / tp
        # n*(ctx+n) over-counts the causal n(n+1)/2 term by ~n^2/2; fine for ranking replicas.
        per_pair = m.num_layers * self.core_flops_per_pair / r["attn_core"].flops_per_s / tp
        per_step = sum(len(self.attention_ops(moe, 1, 1, 1)) for moe in m.moe_layers) * r["attn_proj"].overhead_s
        return linear_cost(per_step, per_token, per_pair)

    def step_breakdown(self, chunks: list[tuple[int, int]], expert_tokens: int, shares: ExpertShares,
                       num_ranks: int, local: bool, total_devices: int) -> dict[str, float]:
        """Per-op seconds, summed over all layers and NOT overlapped, for one rank running the
        chunks [(n, ctx), ...] while its experts' batch holds `expert_tokens` tokens (from all senders).
        For comparing with measured per-stage times line by line."""
        T, pairs, kv = ops.chunk_work(chunks)
        disp = self.seconds_per_copy(num_ranks, local, total_devices, self.hw.dispatch_bytes)
        comb = self.seconds_per_copy(num_ranks, local, total_devices, self.hw.combine_bytes)
        out: dict[str, float] = {}
        for layer, moe in enumerate(self.model.moe_layers):
            layer_ops = self.attention_ops(moe, T, pairs, kv)
            if moe:
                layer_ops.update(self.expert_ops(self.moe_index[layer], expert_tokens, shares))
                copies = max(T, expert_tokens * shares.max_share[self.moe_index[layer]]) * self.model.top_k
                layer_ops["dispatch"] = self.comm_seconds(copies, disp)
                layer_ops["combine"] = self.comm_seconds(copies, comb)
            for k, v in layer_ops.items():
                out[k] = out.get(k, 0.0) + v
        return out


def _rate_seconds(rate, flops, nbytes):
    """OpRate.seconds over numpy arrays."""
    compute, memory = flops / rate.flops_per_s, nbytes / rate.bytes_per_s
    return rate.overhead_s + (np.maximum(compute, memory) if rate.overlap else compute + memory)
