"""Planning one replica step: what the runtime's replica and both simulated engines schedule, written once.

A step is the scheduler's schedule ({request_id: tokens}, chunked prefill under
the token budget), each chunk starting where its request left off, split into
at most k token-balanced micro-batches (asap.scheduler.microbatch). Each
micro-batch carries what every driver needs of it: its chunks, its work
(tokens, causal query-key pairs, context tokens read: asap.cost.ops.chunk_work,
which is what its attention costs) and its earliest TTFT deadline (what the
deadline-first expert selector orders dispatches by). The runtime builds
tensors around it; the simulator prices it with the cost model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from asap.cost.ops import chunk_work
from asap.scheduler.microbatch import Chunk, split_microbatches

_INF = float("inf")


@dataclass(frozen=True, slots=True)
class PlannedMicroBatch:
    index: int
    chunks: list[Chunk]
    num_tokens: int          # T
    pairs: int               # causal query-key pairs
    context: int             # context tokens read (KV)
    deadline: float          # earliest TTFT deadline of its requests (inf: none has one)


@dataclass(frozen=True, slots=True)
class StepPlan:
    schedule: dict[int, int]          # {request_id: tokens this step}; {} when nothing is queued
    starts: dict[int, int]            # {request_id: first prompt token of its chunk}
    microbatches: list[PlannedMicroBatch]

    def __bool__(self) -> bool:
        return bool(self.schedule)


def plan_step(scheduler, now: float, k: int) -> StepPlan:
    """Schedule `scheduler`'s next step (asap.scheduler.replica.ReplicaScheduler) and split it into at most
    k micro-batches. Pure planning: the scheduler's state changes only by `schedule` itself."""
    schedule = scheduler.schedule(now)
    if not schedule:
        return StepPlan({}, {}, [])
    reqs = {rid: scheduler.get(rid) for rid in schedule}
    starts = {rid: r.num_computed for rid, r in reqs.items()}
    mbs = []
    for j, chunks in enumerate(split_microbatches(schedule, starts, k)):
        T, P, K = chunk_work((c.num_tokens, c.start) for c in chunks)
        deadline = min((d for d in (reqs[c.request_id].deadline for c in chunks) if d is not None), default=_INF)
        mbs.append(PlannedMicroBatch(j, chunks, T, P, K, deadline))
    return StepPlan(schedule, starts, mbs)


def token_weighted_length(lengths: Iterable) -> float:
    """sum(L^2) / sum(L) over prompt lengths L (ints, or requests with .num_tokens): the mean prompt length
    a token sees, which is what per-token attention cost grows with."""
    ns = [n if isinstance(n, int) else n.num_tokens for n in lengths]
    total = sum(ns)
    if total <= 0:
        raise ValueError("token_weighted_length needs at least one prompt token")
    return sum(n ** 2 for n in ns) / total
