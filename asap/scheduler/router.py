"""Routers: pick the attention replica a new request joins.

Every router sees the same snapshot, a list of `ReplicaLoad`, and returns one
`ReplicaLoad.index`. Ties always go to the lowest index.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import Protocol

from asap.scheduler.cost import DEFAULT_COST, CostFn
from asap.scheduler.request import Request


@dataclass
class ReplicaLoad:
    """A snapshot of one replica's queue, passed in by the engine or simulator."""
    index: int
    num_requests: int                   # queued + running requests
    num_tokens: int                     # remaining prompt tokens queued + running
    # (remaining_tokens, num_computed) per request; a list, or a tuple (ReplicaScheduler.load's)
    queued: "list[tuple[int, int]] | tuple[tuple[int, int], ...]" = field(default_factory=list)
    busy_until: float = 0.0             # predicted end of the step in progress (absolute time), 0 if idle


class Router(Protocol):
    def route(self, req: Request, loads: list[ReplicaLoad], now: float) -> int: ...


def _check(loads: list[ReplicaLoad]) -> None:
    if not loads:
        raise ValueError("cannot route: no replicas")


class RoundRobinRouter:
    """Cycles through the replicas in list order, ignoring load."""

    def __init__(self):
        self._next = 0

    def route(self, req: Request, loads: list[ReplicaLoad], now: float) -> int:
        _check(loads)
        load = loads[self._next % len(loads)]
        self._next += 1
        return load.index


class LeastRequestsRouter:
    def route(self, req: Request, loads: list[ReplicaLoad], now: float) -> int:
        _check(loads)
        return min(loads, key=lambda l: (l.num_requests, l.index)).index


class LeastTokensRouter:
    def route(self, req: Request, loads: list[ReplicaLoad], now: float) -> int:
        _check(loads)
        return min(loads, key=lambda l: (l.num_tokens, l.index)).index


class QueueAwareRouter:
    """Picks the replica where this request is predicted to finish first.

    finish = max(now, busy_until) + cost(queued) + cost([this request]).
    The queued work and the new request are costed separately (they will not run
    as one batch), which also lets cost(queued) be memoised per replica: it is
    recomputed only when the replica's queue content changed since the last call.
    """

    def __init__(self, cost: CostFn = DEFAULT_COST):
        self.cost = cost
        self._memo: dict[int, tuple[tuple[tuple[int, int], ...], float]] = {}

    def queue_cost(self, load: ReplicaLoad) -> float:
        snapshot = tuple(load.queued)
        hit = self._memo.get(load.index)
        if hit is not None and hit[0] == snapshot:
            if hit[0] is not snapshot:
                self._memo[load.index] = (snapshot, hit[1])     # the newest snapshot: route() matches it by identity
            return hit[1]
        value = self.cost(list(snapshot)) if snapshot else 0.0
        self._memo[load.index] = (snapshot, value)
        return value

    def predict(self, req: Request, load: ReplicaLoad, now: float) -> float:
        """Predicted absolute time at which `req` would finish prefill on this replica."""
        own = self.cost([(req.num_remaining, req.num_computed)])
        return max(now, load.busy_until) + self.queue_cost(load) + own

    def route(self, req: Request, loads: list[ReplicaLoad], now: float) -> int:
        _check(loads)
        # cost([req]) is the same on every replica, so it does not change the choice. The choice is
        # min(loads, key=lambda l: (max(now, l.busy_until) + self.queue_cost(l), l.index)), computed without a
        # Python call per replica: the simulator routes every arrival over hundreds of replicas, and that was
        # most of a sync run's time. A snapshot whose `queued` is the very tuple memoised (immutable: the
        # simulator's ReplicaScheduler.load hands its cached one) reuses its cost without a comparison; any
        # other is compared by content, as queue_cost does. Plain float arithmetic: the package stays pure Python.
        memo = self._memo
        index, queued = list(map(_INDEX, loads)), list(map(_QUEUED, loads))
        costs = [hit[1] if (hit := memo.get(i)) is not None and hit[0] is q else None for i, q in zip(index, queued)]
        j = -1
        while None in costs:
            j = costs.index(None, j + 1)
            costs[j] = self.queue_cost(loads[j])
        t = [(b if b > now else now) + c for b, c in zip(map(_BUSY, loads), costs)]
        best = min(t)
        return min(i for i, x in zip(index, t) if x == best)


_INDEX, _QUEUED, _BUSY = attrgetter("index"), attrgetter("queued"), attrgetter("busy_until")
ROUTERS = ("round-robin", "least-requests", "least-tokens", "queue-aware", "sglang", "vllm")
# The peers' defaults: SGLang's DP-attention scheduler sends requests round-robin over the DP ranks
# (--load-balance-method round_robin); vLLM's data-parallel front end picks the least loaded engine by
# its queued + running requests.
DEFAULTS = {"sglang": "round-robin", "vllm": "least-requests"}


def make_router(name: str = "queue-aware", cost: CostFn | None = None) -> Router:
    name = DEFAULTS.get(name, name)
    if name == "round-robin":
        return RoundRobinRouter()
    if name == "least-requests":
        return LeastRequestsRouter()
    if name == "least-tokens":
        return LeastTokensRouter()
    if name == "queue-aware":
        return QueueAwareRouter(cost if cost is not None else DEFAULT_COST)
    raise ValueError(f"unknown router {name!r}; choose one of {', '.join(ROUTERS)}")
