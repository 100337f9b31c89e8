"""Every FLOP, byte and pair formula of a prefill, written once.

The cost model (asap.cost.model), the emulated workers' cost table
(asap.workers.costs), the simulator and asap.cost.flops all count work with
these functions, so none of them can drift from the others.

Shape legend: D hidden, H heads, E experts, k top-k, I expert width, T tokens,
n new tokens of a chunk, ctx tokens before the chunk.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from asap.config import ModelConfig

ACT_BYTES = 2               # activations and KV in BF16
ELEMENTWISE_PASSES = 12     # norms, RoPE, residual adds, quantisation: passes over T x D after fusion (estimate)


def causal_pairs(n: int, ctx: int) -> int:
    """Query-key pairs of a chunk of n tokens after ctx cached ones, under the causal mask."""
    return n * ctx + n * (n + 1) // 2


def chunk_work(chunks: Iterable[tuple[int, int]]) -> tuple[int, int, int]:
    """(tokens, causal query-key pairs, context tokens read) of chunks [(n, ctx), ...]."""
    tokens = pairs = kv = 0
    for n, ctx in chunks:
        tokens += n
        pairs += causal_pairs(n, ctx)
        kv += ctx + n
    return tokens, pairs, kv


@dataclass(frozen=True)
class AttentionShape:
    """Per-token and per-pair work of one attention layer (one model family's shape)."""
    proj_params: int            # weights of all attention projections (2 FLOPs per weight per token)
    proj_act: int               # activation elements read/written by the projections, per token
    core_flops_per_pair: int    # QK^T and PV per query-key pair
    kv_bytes_per_ctx: int       # K and V bytes read per context token
    q_bytes_per_token: int      # Q in and O out, per token


def attention_shape(cfg: ModelConfig) -> AttentionShape:
    """The attention shape of a config, from its model family's cost parameters (asap.model.families).
    MLA prefill runs as plain MHA (q/k head dim 192, v 128) on the expanded latent, its kv_b expansion
    counted per token as before; GQA reads its KV heads once."""
    a = cfg.attention_cost()
    return AttentionShape(
        proj_params=a.proj_params + a.context_proj_params,
        proj_act=a.proj_act,
        core_flops_per_pair=a.core_flops_per_pair,
        kv_bytes_per_ctx=a.kv_read_bytes_per_ctx(ACT_BYTES),
        q_bytes_per_token=a.q_bytes_per_token(ACT_BYTES))


def expert_params(cfg: ModelConfig) -> int:
    """Weights of one routed expert (gate, up, down)."""
    return 3 * cfg.hidden_size * cfg.moe_intermediate_size


def shared_params(cfg: ModelConfig) -> int:
    return 3 * cfg.hidden_size * cfg.moe_intermediate_size * cfg.n_shared_experts


def dense_params(cfg: ModelConfig) -> int:
    return 3 * cfg.hidden_size * cfg.intermediate_size


def gate_params(cfg: ModelConfig) -> int:
    return cfg.hidden_size * cfg.num_experts


def ffn_row_bytes(cfg: ModelConfig, width: int) -> int:
    """Activation bytes per token through an MLP of `width`: x in, y out, gate/up/act intermediates."""
    return (2 * cfg.hidden_size + 3 * width) * ACT_BYTES


def expert_row_bytes(cfg: ModelConfig) -> int:
    return ffn_row_bytes(cfg, cfg.moe_intermediate_size)


def expert_act_bytes(cfg: ModelConfig) -> int:
    """Bytes per token-expert row of the memory-bound kernels around the expert GEMMs, which run as their
    own kernels (not hidden under the GEMMs): permute into the grouped layout (read + write D in FP8),
    SwiGLU + FP8 quantisation (read 2I BF16, write I FP8) and the weighted un-permute (read D BF16)."""
    D, I = cfg.hidden_size, cfg.moe_intermediate_size
    return 2 * D + 5 * I + 2 * D


def busiest_rows(mean_rows: float, num_workers: int) -> float:
    """The max of W Poisson counts of mean mu is about mu + sqrt(2 ln W mu) (routing noise)."""
    return mean_rows + math.sqrt(2 * math.log(num_workers) * mean_rows) if num_workers > 1 else mean_rows


def touched_experts(rows: float, slots: int) -> float:
    """Expected experts with >= 1 row when `rows` rows fall uniformly on `slots` expert copies."""
    return slots * -math.expm1(-rows / slots)


def padded_rows(rows: float, touched: float, tile_m: int) -> float:
    """Grouped-GEMM rows with each touched expert padded to the row tile (half a tile on average)."""
    return rows + touched * (tile_m - 1) / 2


def expert_gemm_work(cfg: ModelConfig, rows: float, touched: float, tile_m: int,
                     weight_bytes: float) -> tuple[float, float]:
    """(FLOPs, bytes) of a grouped GEMM over `rows` token-expert rows on `touched` experts."""
    p = expert_params(cfg)
    return (2 * padded_rows(rows, touched, tile_m) * p,
            touched * p * weight_bytes + rows * expert_row_bytes(cfg))


def attention_flops(cfg: ModelConfig, num_tokens: int, context: int = 0) -> float:
    """Matmul FLOPs of one attention layer for a chunk of num_tokens after `context` cached tokens."""
    s = attention_shape(cfg)
    return 2 * num_tokens * s.proj_params + s.core_flops_per_pair * causal_pairs(num_tokens, context)


def ffn_flops(cfg: ModelConfig, layer: int, num_tokens: int) -> float:
    """Dense MLP, or gate + shared experts + the top-k routed experts, of one layer."""
    if not cfg.moe_layers[layer]:
        return 2 * num_tokens * dense_params(cfg)
    return 2 * num_tokens * (gate_params(cfg) + shared_params(cfg) + cfg.top_k * expert_params(cfg))


def lm_head_flops(cfg: ModelConfig, num_rows: int = 1) -> float:
    return 2 * num_rows * cfg.hidden_size * cfg.vocab_size
