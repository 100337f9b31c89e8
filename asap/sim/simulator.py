"""The discrete-event loop: a heap of events ordered by (time, sequence number).

Events at the same time run in the order they were scheduled (the sequence
number breaks ties), so a run is deterministic. Handling an event returns the
events it causes, which go back on the heap; the clock only moves forward.
"""
from __future__ import annotations

import heapq
import time as wallclock

from asap.sim.events import Event


class Simulator:
    def __init__(self, engine):
        self.engine = engine
        self.now = 0.0
        self.num_events = 0
        self.wall_s = 0.0
        self._heap: list[tuple[float, int, Event]] = []
        self._seq = 0

    def schedule(self, event: Event) -> None:
        if event.time < self.now:
            raise ValueError(f"event {type(event).__name__} at {event.time} is before now={self.now}")
        heapq.heappush(self._heap, (event.time, self._seq, event))
        self._seq += 1

    def run(self, until: float = float("inf")) -> float:
        """Handle events in (time, seq) order until none are left or the next is after `until`."""
        heap, engine, push, pop = self._heap, self.engine, heapq.heappush, heapq.heappop
        seq, count, start = self._seq, 0, wallclock.perf_counter()
        while heap and heap[0][0] <= until:
            now, _, event = pop(heap)
            self.now = now
            count += 1
            for caused in event.handle(engine):
                if caused.time < now:
                    raise RuntimeError(f"{type(event).__name__} at {now} caused {type(caused).__name__} "
                                       f"in the past ({caused.time})")
                push(heap, (caused.time, seq, caused))
                seq += 1
        self._seq = seq
        self.num_events += count
        self.wall_s += wallclock.perf_counter() - start
        return self.now

    @property
    def pending(self) -> int:
        return len(self._heap)
