"""Start worker processes, wait until every one is ready, and stop them all.

Workers fork from a clean forkserver (never from the engine process: its threads don't survive fork) and
die with the engine process (PR_SET_PDEATHSIG plus a parent-liveness check). Each beats into a shared
HeartbeatBoard (asap.workers.heartbeat), so the engine can tell a hung worker from a busy one.

Stop order: attention workers (and sync ranks) first, while the experts they may be waiting on still
answer; then the expert workers. Each stage gets stop_grace_s to exit; whatever is left (hung,
SIGSTOPped, blocked on a dead peer) is killed, so close() and restart() take about 2 x stop_grace_s at most.
"""
from __future__ import annotations

import atexit
import contextlib
import sys
import multiprocessing as mp
import queue as queue_mod
import time
import weakref

from asap.workers.heartbeat import HeartbeatBoard
from asap.workers.main import WorkerSpec, worker_main
from asap.workers.messages import Failure, Ready, Shutdown


class WorkerError(RuntimeError):
    pass


@contextlib.contextmanager
def _main_hidden():
    """Start workers without re-importing the caller's __main__ (spawn does that by default).

    Workers only need asap, and a user script without an `if __name__ == "__main__"` guard
    would otherwise start engines recursively in every worker."""
    main = sys.modules.get("__main__")
    saved = {k: getattr(main, k) for k in ("__spec__", "__file__") if hasattr(main, k)}
    try:
        for k in saved:
            setattr(main, k, None) if k == "__spec__" else delattr(main, k)
        yield
    finally:
        for k, v in saved.items():
            setattr(main, k, v)


class Cluster:
    def __init__(self, specs: list[WorkerSpec], transport_spec):
        # Fork from a server that has imported torch once: tens of workers start in seconds, not minutes.
        # The server runs no torch ops before forking, so no thread pool crosses the fork.
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "asap.workers.main"])
        self.specs, self.transport_spec = specs, transport_spec
        rt = specs[0].runtime
        self.heartbeat_timeout_s = rt.heartbeat_timeout_s
        self.results = ctx.Queue()
        # Two stop flags, one per stage: replicas (attention workers, sync ranks) stop before experts.
        self.stops = {"replicas": StopFlag(ctx), "experts": StopFlag(ctx)}
        # Replicas (async attention workers, sync ranks) take requests; expert workers take none.
        self.controls = {s.index: ctx.Queue() for s in specs if s.role != "expert"}
        self.procs = {}
        self.early: list = []            # non-Ready messages that arrived during start-up
        self.heartbeats = HeartbeatBoard(ctx, [f"{s.role}{s.index}" for s in specs])
        for s in specs:
            name = f"{s.role}{s.index}"
            beat = self.heartbeats.heartbeat(name, rt.heartbeat_interval_s, rt.comm_timeout_s + rt.heartbeat_timeout_s)
            stop = self.stops["experts" if s.role == "expert" else "replicas"]
            self.procs[name] = ctx.Process(target=worker_main, name=f"asap-{name}", daemon=True,
                                           args=(s, self.controls.get(s.index), self.results, stop, beat))
        self._finalizer = weakref.finalize(self, Cluster._shutdown, self.procs, self.controls, self.stops,
                                           self.results, transport_spec, rt.stop_grace_s)
        atexit.register(self._finalizer)
        with _main_hidden():
            for p in self.procs.values():
                p.start()

    def wait_ready(self, timeout: float = 300.0) -> None:
        pending = {s.rank for s in self.specs}
        end = time.monotonic() + timeout
        while pending:
            dead = self.dead()
            if dead:
                self._raise_failure(self._drain_failure(0.5) or f"worker(s) exited during start-up: {dead}")
            if time.monotonic() > end:
                raise WorkerError(f"workers not ready after {timeout:.0f}s: ranks {sorted(pending)}")
            try:
                msg = self.results.get(timeout=0.2)
            except queue_mod.Empty:
                continue
            if isinstance(msg, Ready):
                pending.discard(msg.rank)
            elif isinstance(msg, Failure):
                self._raise_failure(f"{msg.worker} failed during start-up:\n{msg.error}")
            else:
                self.early.append(msg)

    def _drain_failure(self, wait_s: float) -> str | None:
        """A worker that fails at start-up reports why and exits: read its report if it is on the way."""
        end = time.monotonic() + wait_s
        while time.monotonic() < end:
            try:
                msg = self.results.get(timeout=0.05)
            except (queue_mod.Empty, OSError, EOFError):
                continue
            if isinstance(msg, Failure):
                return f"{msg.worker} failed during start-up:\n{msg.error}"
        return None

    @staticmethod
    def _raise_failure(text: str):
        """A broken model is bad input: its one-line ModelLoadError, not the worker's traceback."""
        last = text.strip().splitlines()[-1]
        prefix = "asap.model.errors.ModelLoadError: "
        if last.startswith(prefix):
            from asap.model.errors import ModelLoadError
            raise ModelLoadError("", last[len(prefix):]) from None
        raise WorkerError(text)

    def dead(self) -> dict[str, int]:
        """Workers that have exited, with their exit codes."""
        return {n: p.exitcode for n, p in self.procs.items() if p.exitcode is not None}

    def silent(self) -> dict[str, float]:
        """Live workers that missed their heartbeats for heartbeat_timeout_s -> seconds silent."""
        return self.heartbeats.stale(self.heartbeat_timeout_s, [n for n, p in self.procs.items() if p.exitcode is None])

    def close(self) -> None:
        self._finalizer()

    @staticmethod
    def _shutdown(procs, controls, stops, results, transport_spec, grace_s):
        started = {n: p for n, p in procs.items() if p.pid is not None}
        replicas = [p for n, p in started.items() if not n.startswith("expert")]
        experts = [p for n, p in started.items() if n.startswith("expert")]
        stops["replicas"].set()
        for q in controls.values():
            try:
                q.put_nowait(Shutdown())
            except Exception:  # noqa: BLE001 - a closed queue during interpreter exit
                pass
        _stop(replicas, grace_s)
        stops["experts"].set()
        _stop(experts, grace_s)
        for q in [*controls.values(), results]:
            q.cancel_join_thread()          # a stopped reader must not hold our exit on a full pipe
        try:
            results._writer.close()         # a collector blocked on a half-written message gets EOF, not a hang
        except Exception:  # noqa: BLE001
            pass
        try:
            transport_spec.cleanup()
        except Exception:  # noqa: BLE001
            pass


class StopFlag:
    """A stop signal the launcher sets and workers poll (`set`, `is_set`), one byte of shared memory with no lock.
    A multiprocessing.Event takes a lock even in is_set(), so a worker SIGKILLed while polling it left the lock
    held and the launcher's set() blocked forever (a restart after an expert kill hung)."""

    def __init__(self, ctx):
        self._flag = ctx.RawValue("b", 0)

    def set(self) -> None:
        self._flag.value = 1

    def is_set(self) -> bool:
        return bool(self._flag.value)


def _stop(procs, grace_s: float) -> None:
    """Join each process for up to grace_s in all, then SIGKILL the rest (SIGKILL also ends a stopped one)."""
    deadline = time.monotonic() + grace_s
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(timeout=2)
