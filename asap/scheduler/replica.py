"""Per-replica scheduler: which prompt tokens one attention replica prefills next.

A schedule is `{request_id: num_tokens}` (chunked prefill): each request's chunk
starts at its `num_computed`. The loop is schedule -> run -> commit.

Order of service in a step:
1. running requests (already started), in the order they started;
2. waiting requests by priority (higher first); within one priority, requests
   waiting longer than `starvation_s` (oldest first), then the rest by `order`:
   "fcfs" (arrival), "sjf" (fewest remaining tokens) or "edf" (earliest deadline,
   None = +inf). Ties fall back to arrival, then to insertion order.
A request's priority and sort key are read when it is added.

The preemptive orders "srpt" (fewest remaining tokens) and "edf-preempt" (earliest deadline) drop step 1's
precedence: a started request competes with the waiting ones by the same key at every step (its key read
again each step: SRPT's remaining tokens shrink as it runs), so a short prompt that arrives behind a long
one's first chunks runs next instead of after the long one's last. Preemption is at chunk boundaries only:
a paused request keeps its KV and its place among the running (`max_running` still bounds them), and nothing
is recomputed. Priority levels and the starvation guard apply to the waiting requests as above.
"""
from __future__ import annotations

import heapq
import itertools

from asap.scheduler.errors import QueueFull
from asap.scheduler.request import Request
from asap.scheduler.router import ReplicaLoad

ORDERS = ("fcfs", "sjf", "edf", "srpt", "edf-preempt")
PREEMPTIVE = {"srpt": "sjf", "edf-preempt": "edf"}     # a preemptive order -> the key it sorts by
_INF = float("inf")


def _order_key(req: Request, order: str) -> tuple[float, float]:
    if order == "fcfs":
        return (req.arrival, 0.0)
    if order in ("sjf", "srpt"):
        return (float(req.num_remaining), req.arrival)
    return (_INF if req.deadline is None else req.deadline, req.arrival)


class _Level:
    """The waiting requests of one priority: a heap by order key and a heap by arrival."""

    def __init__(self):
        self.by_order: list = []
        self.by_arrival: list = []

    def push(self, key: tuple[float, float], seq: int, req: Request, by_arrival: bool) -> int:
        heapq.heappush(self.by_order, (key, seq, req))
        if by_arrival:                  # only needed by the starvation guard
            heapq.heappush(self.by_arrival, (req.arrival, seq, req))
        return 1 + by_arrival


class ReplicaScheduler:
    def __init__(self, token_budget: int, order: str = "fcfs", max_queue: int = 1024,
                 starvation_s: float | None = 5.0, max_running: int = 256):
        if token_budget <= 0:
            raise ValueError(f"token_budget must be > 0, got {token_budget}")
        if order not in ORDERS:
            raise ValueError(f"unknown order {order!r}; choose one of {', '.join(ORDERS)}")
        if max_queue < 0 or max_running < 1:
            raise ValueError(f"need max_queue >= 0 and max_running >= 1, got {max_queue}, {max_running}")
        if starvation_s is not None and starvation_s < 0:
            raise ValueError(f"starvation_s must be >= 0 or None, got {starvation_s}")
        self.token_budget = token_budget
        self.order = order
        self._preempt = order in PREEMPTIVE
        self.max_queue = max_queue
        self.starvation_s = starvation_s
        self.max_running = max_running
        self._guard = starvation_s is not None
        self._requests: dict[int, Request] = {}     # every request held, waiting or running
        self._running: dict[int, Request] = {}      # started, in start order
        self._levels: dict[int, _Level] = {}        # priority -> waiting heaps (lazy deletion)
        self._seq = itertools.count()
        self._num_heap_entries = 0
        self._num_tokens = 0                        # sum of num_remaining over held requests
        self._queued: tuple[tuple[int, int], ...] | None = None   # cached ReplicaLoad.queued

    # ---- queue ----
    def add(self, req: Request) -> None:
        if req.id in self._requests:
            raise ValueError(f"request {req.id} is already queued on this replica")
        if req.done:
            raise ValueError(f"request {req.id} has no tokens left to prefill")
        if self.num_waiting >= self.max_queue:
            raise QueueFull(f"replica queue full ({self.max_queue} waiting); request {req.id} not added")
        self._requests[req.id] = req
        self._num_tokens += req.num_remaining
        self._queued = None
        level = self._levels.setdefault(req.priority, _Level())
        self._num_heap_entries += level.push(_order_key(req, self.order), next(self._seq), req, self._guard)
        if self._num_heap_entries > 4 * len(self._requests) + 64:
            self._rebuild()

    def abort(self, request_id: int) -> Request | None:
        req = self._requests.pop(request_id, None)
        if req is not None:
            self._running.pop(request_id, None)
            self._num_tokens -= req.num_remaining
            self._queued = None
        return req

    def get(self, request_id: int) -> Request:
        return self._requests[request_id]

    def __contains__(self, request_id: int) -> bool:
        return request_id in self._requests

    def __len__(self) -> int:
        return len(self._requests)

    @property
    def num_waiting(self) -> int:
        return len(self._requests) - len(self._running)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    def load(self, index: int, busy_until: float = 0.0) -> ReplicaLoad:
        if self._queued is None:
            self._queued = tuple((r.num_remaining, r.num_computed) for r in self._requests.values())
        # the cached tuple itself (immutable): QueueAwareRouter then knows it by identity, not by comparing it
        return ReplicaLoad(index, len(self._requests), self._num_tokens, self._queued, busy_until)

    # ---- step ----
    def schedule(self, now: float) -> dict[int, int]:
        """Chunks for the next step; sum(values) <= token_budget. Does not touch num_computed.

        Requests picked from the waiting queue become running here, so calling
        schedule twice without commit returns the same plan.
        """
        if self._preempt:
            return self._schedule_preemptive(now)
        budget = self.token_budget
        plan: dict[int, int] = {}
        for req in self._running.values():
            if budget == 0:
                return plan
            n = min(req.num_remaining, budget)
            plan[req.id] = n
            budget -= n
        while budget > 0 and len(self._running) < self.max_running:
            req = self._pop_waiting(now)
            if req is None:
                break
            self._running[req.id] = req
            n = min(req.num_remaining, budget)
            plan[req.id] = n
            budget -= n
        return plan

    def commit(self, schedule: dict[int, int]) -> list[Request]:
        """Advance num_computed by what ran; remove and return the requests that finished.

        Ids no longer held (aborted while the step ran) are ignored.
        """
        finished = []
        for rid, n in schedule.items():
            req = self._requests.get(rid)
            if req is None:
                continue
            if not 0 < n <= req.num_remaining:
                raise ValueError(f"request {rid}: committed {n} tokens but {req.num_remaining} remain")
            req.num_computed += n
            self._num_tokens -= n
            if req.done:
                del self._requests[rid]
                self._running.pop(rid, None)
                finished.append(req)
            else:
                self._running.setdefault(rid, req)
        self._queued = None
        return finished

    def _schedule_preemptive(self, now: float) -> dict[int, int]:
        """schedule() under a preemptive order: the running requests (by their key now) and the head of the
        waiting queue merged by key, the smaller first, until the budget is spent."""
        budget = self.token_budget
        plan: dict[int, int] = {}
        running = sorted(self._running.values(), key=lambda r: _order_key(r, self.order))
        i = 0
        while budget > 0:
            heap = self._waiting_heap(now) if len(self._running) < self.max_running else None
            if heap is not None and (i == len(running)
                                     or _order_key(heap[0][2], self.order) < _order_key(running[i], self.order)):
                self._num_heap_entries -= 1
                req = heapq.heappop(heap)[2]
                self._running[req.id] = req
            elif i < len(running):
                req, i = running[i], i + 1
            else:
                break
            n = min(req.num_remaining, budget)
            plan[req.id] = n
            budget -= n
        return plan

    # ---- internals ----
    def _is_waiting(self, req: Request) -> bool:
        return self._requests.get(req.id) is req and req.id not in self._running

    def _clean(self, heap: list) -> None:
        while heap and not self._is_waiting(heap[0][2]):
            heapq.heappop(heap)
            self._num_heap_entries -= 1

    def _pop_waiting(self, now: float) -> Request | None:
        heap = self._waiting_heap(now)
        if heap is None:
            return None
        self._num_heap_entries -= 1
        return heapq.heappop(heap)[2]

    def _waiting_heap(self, now: float) -> list | None:
        """The heap whose head is the next waiting request (cleaned of stale entries), or None if none waits."""
        for priority in sorted(self._levels, reverse=True):
            level = self._levels[priority]
            heap = level.by_order
            if self._guard:
                self._clean(level.by_arrival)
                if level.by_arrival and level.by_arrival[0][0] < now - self.starvation_s:
                    heap = level.by_arrival
            self._clean(heap)
            if heap:
                return heap
            del self._levels[priority]       # by_order empty => no waiting request at this priority
            self._num_heap_entries -= len(level.by_arrival)
        return None

    def _rebuild(self) -> None:
        """Drop stale heap entries (left by requests taken through the other heap, or aborted)."""
        old = self._levels
        self._levels = {}
        self._num_heap_entries = 0
        for priority, level in old.items():
            for key, seq, req in level.by_order:
                if self._is_waiting(req):
                    kept = self._levels.setdefault(priority, _Level())
                    self._num_heap_entries += kept.push(key, seq, req, self._guard)
