"""Micro-batching: split one replica step into micro-batches balanced by tokens.

The step's chunks are laid end to end (in schedule order) and cut at k-1 evenly
spaced token offsets, so micro-batch sizes differ by at most one token. A cut
that would leave a piece shorter than `min_tokens` moves to the nearer request
boundary when it can, trading a little balance for fewer tiny pieces; each cut
moves by less than `min_tokens`, so max - min <= 4*(min_tokens - 1) + 1.
Laying chunks end to end keeps every split request's pieces contiguous and in
micro-batch order, which is what attention needs: piece i+1 reads the KV that
piece i wrote at the same layer, and micro-batches run each layer in order.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Chunk:
    request_id: int
    start: int          # first prompt token of this piece
    num_tokens: int     # tokens [start, start + num_tokens)


def split_microbatches(schedule: dict[int, int], starts: dict[int, int], k: int,
                       min_tokens: int = 1) -> list[list[Chunk]]:
    """Split {request_id: num_tokens} (chunks starting at starts[request_id]) into <= k micro-batches.

    Returns min(k, total // min_tokens) micro-batches (at least one), none empty;
    [] for an empty schedule.
    """
    if k < 1 or min_tokens < 1:
        raise ValueError(f"need k >= 1 and min_tokens >= 1, got k={k}, min_tokens={min_tokens}")
    ids = list(schedule)
    missing = [rid for rid in ids if rid not in starts]
    if missing:
        raise ValueError(f"no start offset for requests {missing}")
    if any(schedule[rid] <= 0 for rid in ids):
        raise ValueError(f"every scheduled chunk needs > 0 tokens: {schedule}")
    ends = list(_accumulate(schedule[rid] for rid in ids))   # line offsets where each chunk ends
    total = ends[-1] if ends else 0
    if total == 0:
        return []
    k = max(1, min(k, total // min_tokens))
    cuts = []
    prev = 0
    for j in range(1, k):
        ideal = j * total // k
        cut = _snap(ideal, ends, min_tokens)
        if not prev < cut < total:
            cut = ideal         # spacing >= min_tokens guarantees prev < ideal < total
        cuts.append(cut)
        prev = cut
    cuts.append(total)

    batches: list[list[Chunk]] = [[] for _ in range(k)]
    b = 0
    begin = 0
    for rid, end in zip(ids, ends):
        pos = begin
        while pos < end:
            stop = min(end, cuts[b])
            batches[b].append(Chunk(rid, starts[rid] + pos - begin, stop - pos))
            pos = stop
            if pos == cuts[b]:
                b += 1
        begin = end
    return batches


def _accumulate(values):
    s = 0
    for v in values:
        s += v
        yield s


def _snap(cut: int, ends: list[int], min_tokens: int) -> int:
    """Move `cut` to the nearer edge of the chunk it falls in if a piece would be < min_tokens."""
    i = bisect.bisect_right(ends, cut)          # chunk i spans [ends[i-1], ends[i])
    if i == len(ends):
        return cut
    begin = ends[i - 1] if i else 0
    left, right = cut - begin, ends[i] - cut
    if left == 0 or (left >= min_tokens and right >= min_tokens):
        return cut
    return begin if left <= right else ends[i]


class AdaptiveDepth:
    """Number of micro-batches k that hides the expert round trip behind attention.

    While one micro-batch waits for its experts (round trip R), the others run
    attention (time A each); ceil(R/A) others plus itself keep the replica busy.
    Both times are smoothed by an EMA; k is clamped to [min_k, max_k]. Engines do not build one
    directly: asap.pipeline.depth.StepDepth holds the one rule (bounds, once-per-step updates).
    """

    def __init__(self, min_k: int = 2, max_k: int = 4, alpha: float = 0.2):
        if not 1 <= min_k <= max_k:
            raise ValueError(f"need 1 <= min_k <= max_k, got {min_k}, {max_k}")
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.min_k, self.max_k, self.alpha = min_k, max_k, alpha
        self.attn_time: float | None = None
        self.expert_roundtrip: float | None = None

    def update(self, attn_time: float, expert_roundtrip: float) -> None:
        if attn_time < 0 or expert_roundtrip < 0:
            raise ValueError(f"times must be >= 0, got {attn_time}, {expert_roundtrip}")
        if self.attn_time is None:
            self.attn_time, self.expert_roundtrip = attn_time, expert_roundtrip
            return
        a = self.alpha
        self.attn_time += a * (attn_time - self.attn_time)
        self.expert_roundtrip += a * (expert_roundtrip - self.expert_roundtrip)

    @property
    def k(self) -> int:
        if self.attn_time is None:
            return self.min_k
        if self.attn_time <= 0:
            return self.max_k
        want = math.ceil(self.expert_roundtrip / self.attn_time - 1e-9) + 1
        return max(self.min_k, min(self.max_k, want))
