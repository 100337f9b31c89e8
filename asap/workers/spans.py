"""Per-worker time accounting: compute, stall (waiting on peers) and idle spans.

Bounded: spans wait in a ring of `capacity` entries until the loop flushes them
to the engine; if nobody flushes for that long the oldest are dropped (and
counted), so a long-lived worker never grows without bound.

On a GPU a span must cover its kernels, not their launches, yet must not wait
for them: its edges are CUDA events recorded on the current stream, turned into
monotonic times when the loop flushes (only events that have completed, unless
forced), so timing adds no host sync to the layer loop.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from contextlib import contextmanager

import torch

KINDS = ("compute", "stall", "idle")


class SpanRecorder:
    def __init__(self, worker: str, flush_every_s: float = 0.5, capacity: int = 65536):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.worker, self.flush_every_s = worker, flush_every_s
        self.pending: deque[tuple[str, float, float]] = deque(maxlen=capacity)
        self.num_dropped = 0
        self._last_flush = time.monotonic()
        # Set on a GPU (to compute.synchronize, asap.workers.main): spans are then timed with CUDA events
        # (`event`, a torch.cuda.Event-like class) and never call it in the loop.
        self.sync = None
        self.event = None if not torch.cuda.is_available() else torch.cuda.Event
        self._open: deque[tuple[str, object, object]] = deque()   # device spans whose end may not have run yet
        self._clock = None                                         # (monotonic time, event recorded then)

    @contextmanager
    def span(self, kind: str):
        if self.sync is not None and self.event is not None:
            start = self._mark()
            try:
                yield
            finally:
                self._open.append((kind, start, self._mark()))
                if len(self._open) > self.pending.maxlen:      # nobody flushes: stay bounded
                    self._resolve(force=True)
            return
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.add(kind, t0, time.monotonic())

    def _mark(self):
        ev = self.event(enable_timing=True)
        ev.record()
        if self._clock is None:          # the device-to-monotonic reference, taken once
            ev.synchronize()
            self._clock = (time.monotonic(), ev)
        return ev

    def _resolve(self, force: bool) -> None:
        """Move device spans whose end event has run into `pending`, in order, as monotonic times."""
        t_ref, ref = self._clock or (0.0, None)
        while self._open:
            kind, start, end = self._open[0]
            if not force and not end.query():
                break
            end.synchronize()
            self._open.popleft()
            self.add(kind, t_ref + ref.elapsed_time(start) / 1e3, t_ref + ref.elapsed_time(end) / 1e3)

    def add(self, kind: str, start: float, end: float) -> None:
        if end > start:
            if self.pending and self.pending[-1][0] == kind and start - self.pending[-1][2] < 1e-4:
                self.pending[-1] = (kind, self.pending[-1][1], end)     # merge back-to-back spans
            else:
                if len(self.pending) == self.pending.maxlen:
                    self.num_dropped += 1
                self.pending.append((kind, start, end))

    def take(self, force: bool = False) -> list | None:
        self._resolve(force)
        now = time.monotonic()
        if not self.pending or (not force and now - self._last_flush < self.flush_every_s):
            return None
        self._last_flush = now
        out = list(self.pending)
        self.pending.clear()
        return out


def fractions(spans, start: float | None = None, end: float | None = None) -> dict[str, float]:
    """Busy/stall/idle fractions of one worker's spans over [start, end]."""
    if not spans:
        return {k: 0.0 for k in KINDS}
    start = min(s for _, s, _ in spans) if start is None else start
    end = max(e for _, _, e in spans) if end is None else end
    total = max(end - start, 1e-9)
    out = {k: 0.0 for k in KINDS}
    for kind, s, e in spans:
        out[kind] += max(0.0, min(e, end) - max(s, start)) / total
    return out


class SpanLog(dict):
    """The engine's copy of every worker's spans: {worker: [(kind, start, end), ...]}, oldest first.

    Bounded: past `capacity` spans a worker's list loses its oldest (counted in `dropped`), so a
    long-lived engine never grows without bound; fractions over a window older than what is kept
    therefore see only its newest part. Lists, not deques, so readers may iterate while the collector
    thread appends. Trimming goes through `add` and `trim` under one lock."""

    def __init__(self, capacity: int = 1 << 17):
        super().__init__()
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity, self.dropped = capacity, {}
        self._lock = threading.Lock()

    def add(self, worker: str, spans) -> None:
        with self._lock:
            lst = self.setdefault(worker, [])
            lst.extend(spans)
            if len(lst) > self.capacity + self.capacity // 4:     # trim in batches: amortised O(1) per span
                n = len(lst) - self.capacity
                del lst[:n]
                self.dropped[worker] = self.dropped.get(worker, 0) + n

    def trim(self, before: float) -> None:
        """Forget the spans that ended before `before` (monotonic clock)."""
        with self._lock:
            for lst in self.values():
                old = 0
                while old < len(lst) and lst[old][2] < before:
                    old += 1
                if old:
                    del lst[:old]
