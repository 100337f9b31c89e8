"""What the simulated async and sync engines share: request intake, replica
queues, results and trace spans. Only the loop differs (async_engine.py, sync_engine.py),
so a difference between them can only come from synchronisation.
"""
from __future__ import annotations

from asap.measure.metrics import RequestResult
from asap.scheduler.errors import QueueFull
from asap.scheduler.replica import ReplicaScheduler
from asap.scheduler.request import Request
from asap.sim.cost import CostModel


class EngineBase:
    def __init__(self, cost: CostModel, num_replicas: int, router, token_budget: "int | list[int]",
                 order: str = "fcfs", max_queue: int = 1024, trace_window: tuple[float, float] | None = None):
        """token_budget: every replica's, or one per replica (a length-aware fleet's wide replicas)."""
        if num_replicas < 1:
            raise ValueError(f"need at least one attention replica, got {num_replicas}")
        budgets = list(token_budget) if isinstance(token_budget, (list, tuple)) else [token_budget] * num_replicas
        if len(budgets) != num_replicas:
            raise ValueError(f"{len(budgets)} token budgets for {num_replicas} replicas")
        self.cost = cost
        self.model = cost.model
        self.router = router
        self.schedulers = [ReplicaScheduler(b, order=order, max_queue=max_queue) for b in budgets]
        self.busy_until = [0.0] * num_replicas
        self._loads: list = [None] * num_replicas     # cached ReplicaLoad, None when stale
        self.results: dict[int, RequestResult] = {}
        self.trace_window = trace_window
        self.spans: list[tuple[str, int, str, float, float, dict]] = []   # (group, index, name, start, end, args)

    # ---- intake ----
    def loads(self) -> list:
        cached = self._loads
        for i, load in enumerate(cached):
            if load is None:
                cached[i] = self.schedulers[i].load(i, self.busy_until[i])
        return cached

    def touch(self, replica: int) -> None:
        self._loads[replica] = None

    def on_arrival(self, req: Request, now: float) -> list:
        i = self.router.route(req, list(self.loads()), now)
        if not 0 <= i < len(self.schedulers):
            raise ValueError(f"router returned replica {i}; there are {len(self.schedulers)}")
        try:
            self.schedulers[i].add(req)
        except QueueFull as e:
            self.finish(req, now, f"QueueFull: {e}")
            return []
        self.touch(i)
        return self.kick(i, now)

    def kick(self, replica: int, now: float) -> list:
        """Start work on `replica` if it is idle (engine-specific)."""
        raise NotImplementedError

    # ---- outcome ----
    def finish(self, req: Request, now: float, error: str | None = None) -> None:
        if req.id in self.results:
            raise RuntimeError(f"request {req.id} finished twice")
        self.results[req.id] = RequestResult.of(req, None if error else now - req.arrival, error)

    def span(self, group: str, index: int, name: str, start: float, end: float, **args) -> None:
        w = self.trace_window
        if w is not None and start < w[1] and end > w[0]:
            self.spans.append((group, index, name, start, end, args))

    def stats(self) -> dict:
        return {}
