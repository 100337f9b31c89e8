"""Communication costs: expert dispatch/combine copies and the tensor-parallel all-reduce.

Dispatch (token copies to experts) and combine (back), per sender: latency + copies x
seconds-per-copy, where a copy to a rank that already gets the token, or to the sender
itself, is free, and across nodes a token crosses once per destination node, then is
forwarded inside the node (DeepEP's scheme).
"""
from __future__ import annotations

import math
from functools import lru_cache

from asap.cost.hardware import Link
from asap.cost.ops import ACT_BYTES


@lru_cache(maxsize=256)
def seconds_per_copy(link: Link, hidden: int, top_k: int, num_ranks: int, local: bool, total_devices: int,
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


def allreduce_seconds(link: Link, num_tokens: int, hidden: int, tp: int) -> float:
    """Ring all-reduce of [T, D] BF16 activations over `tp` devices inside one node (a reduce-scatter plus
    an all-gather): 2 (tp-1)/tp of the bytes at the bus rate, plus one latency per phase."""
    if tp <= 1 or num_tokens <= 0:
        return 0.0
    nbytes = num_tokens * hidden * ACT_BYTES
    return 2 * link.latency_s + 2 * (tp - 1) / tp * nbytes / link.allreduce_bytes_per_s
