"""Predicted prefill time of a batch on one attention replica.

A batch is a list of (num_new_tokens, num_context_tokens_before_chunk) pairs.
The simulator's cost model supplies calibrated functions; `linear_cost` is the
simple default shape: a fixed step overhead, a per-token term (projections,
norms, gating) and a per-token-pair term (causal attention over the context).
"""
from __future__ import annotations

from typing import Callable

CostFn = Callable[[list[tuple[int, int]]], float]


def linear_cost(a: float, b: float, c: float) -> CostFn:
    """Seconds = a + b*sum(n) + c*sum(n*(ctx+n))."""
    if min(a, b, c) < 0:
        raise ValueError(f"cost coefficients must be >= 0, got a={a} b={b} c={c}")

    def cost(batch: list[tuple[int, int]]) -> float:
        num_tokens = 0
        num_pairs = 0
        for n, ctx in batch:
            num_tokens += n
            num_pairs += n * (ctx + n)
        return a + b * num_tokens + c * num_pairs

    return cost


# Rough DeepSeek-V3-like attention replica (our own arithmetic: ~15k tokens/s of
# linear work, ~2.5e-8 s per causal token pair across 61 layers). Only ratios
# matter for routing; use the simulator's cost model for absolute times.
DEFAULT_COST: CostFn = linear_cost(1e-3, 6.5e-5, 1.25e-8)
