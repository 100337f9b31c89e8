"""Worker liveness: every worker beats into a shared array; the engine declares a silent one failed.

Worker side: a thread writes time.monotonic() (one clock for every process on a host) into the
worker's slot every `interval_s`, but only while the worker shows progress:
  - its loop went round or recorded a span (every loop records one per iteration), or
  - it is inside a compute span (a long legitimate step: seconds for a 16K chunk on CPU), or
  - it has been quiet for less than `quiet_limit_s` (comm_timeout_s + heartbeat_timeout_s: every wait
    on a peer is bounded by comm_timeout_s and then goes round the loop).
A SIGSTOPped process stops every thread, so its beats stop at once; a main loop that deadlocks
outside compute stops them after quiet_limit_s.

Engine side: HeartbeatBoard.stale(timeout_s) names the workers whose last beat is older than timeout_s.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager

from asap.workers.spans import SpanRecorder


class HeartbeatBoard:
    """One float64 slot per worker in shared memory: its last beat (0 = none yet)."""

    def __init__(self, mp_ctx, names: list[str]):
        self.slots = {name: i for i, name in enumerate(names)}
        self.beats = mp_ctx.RawArray("d", len(names))

    def heartbeat(self, name: str, interval_s: float, quiet_limit_s: float) -> "Heartbeat":
        return Heartbeat(self.beats, self.slots[name], interval_s, quiet_limit_s)

    def stale(self, timeout_s: float, names=None, now: float | None = None) -> dict[str, float]:
        """Workers (among `names`, default all) that beat once and then not for timeout_s -> seconds silent."""
        now = time.monotonic() if now is None else now
        out = {}
        for name in names if names is not None else self.slots:
            last = self.beats[self.slots[name]]
            if last > 0 and now - last > timeout_s:
                out[name] = now - last
        return out


class Heartbeat:
    """The worker's half: picklable until start(); attach() hooks it into a WorkerContext."""

    def __init__(self, beats, slot: int, interval_s: float, quiet_limit_s: float):
        self.beats, self.slot, self.interval_s, self.quiet_limit_s = beats, slot, interval_s, quiet_limit_s
        self.progress = 0            # bumped by the worker's main thread; read by the beat thread
        self.computing = 0           # > 0 while the main thread is inside a compute span

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_thread"}

    def attach(self, ctx) -> None:
        """Count the worker's spans as progress, then start beating."""
        ctx.spans = _BeatingSpans(ctx.spans.worker, self)
        self.start()

    def start(self) -> None:
        self.beats[self.slot] = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="asap-heartbeat", daemon=True)
        self._thread.start()

    def should_beat(self, seen: int, quiet_since: float, now: float) -> bool:
        return self.progress != seen or self.computing > 0 or now - quiet_since < self.quiet_limit_s

    def _run(self) -> None:
        seen, quiet_since = self.progress, time.monotonic()
        while True:
            now = time.monotonic()
            if self.should_beat(seen, quiet_since, now):
                self.beats[self.slot] = now
            if self.progress != seen:
                seen, quiet_since = self.progress, now
            time.sleep(self.interval_s)


class _BeatingSpans(SpanRecorder):
    """A SpanRecorder that reports each recorded span as progress and marks open compute spans."""

    def __init__(self, worker: str, heartbeat: Heartbeat):
        super().__init__(worker)
        self.heartbeat = heartbeat

    @contextmanager
    def span(self, kind: str):
        computing = kind == "compute"
        self.heartbeat.computing += computing
        try:
            with super().span(kind):
                yield
        finally:
            self.heartbeat.computing -= computing

    def add(self, kind: str, start: float, end: float) -> None:
        self.heartbeat.progress += 1
        super().add(kind, start, end)
