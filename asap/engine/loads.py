"""The engine's view of each replica's queue: what the router sees, the same fields the simulator's router
gets from asap.scheduler.replica.ReplicaScheduler.load.

Per request: its prompt tokens and how many are computed; per replica: when the step in progress is
predicted to end. The engine adds a request when it routes it and drops it when its result comes; each
replica reports every step it plans (asap.workers.messages.Planned: each request's computed tokens at the
step's start and its tokens this step), from which the engine predicts the step's end with the router's own
cost function. So the queue-aware router weighs a half-prefilled prompt by what is left of it, and a
replica in the middle of a long step by when that step ends, as it does in the simulator.
"""
from __future__ import annotations

from asap.scheduler.router import ReplicaLoad


class ReplicaBook:
    def __init__(self):
        self.requests: dict[int, list[int]] = {}      # id -> [num_tokens, num_computed]
        self.busy_until = 0.0                         # predicted end of the step in progress (monotonic), 0: idle

    def add(self, request_id: int, num_tokens: int) -> None:
        self.requests[request_id] = [num_tokens, 0]

    def pop(self, request_id: int, default=None):
        return self.requests.pop(request_id, default)

    def clear(self) -> None:
        self.requests.clear()
        self.busy_until = 0.0

    def planned(self, step: dict[int, tuple[int, int]], now: float, cost) -> None:
        """A step started at `now`: step = {id: (computed at its start, tokens this step)}; cost(chunks of
        (tokens, context)) -> seconds, the router's cost function."""
        for rid, (computed, _) in step.items():
            if rid in self.requests:
                self.requests[rid][1] = computed
        self.busy_until = now + cost([(n, computed) for computed, n in step.values()]) if step else 0.0

    def load(self, index: int) -> ReplicaLoad:
        queued = [(n - done, done) for n, done in self.requests.values()]
        return ReplicaLoad(index, len(queued), sum(left for left, _ in queued), queued, self.busy_until)
