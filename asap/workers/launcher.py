"""Start worker processes, wait until every one is ready, and stop them all.

Workers fork from a clean forkserver (never from the engine process: its threads don't survive fork) and
die with the engine process (PR_SET_PDEATHSIG plus a parent-liveness check).
"""
from __future__ import annotations

import atexit
import contextlib
import sys
import multiprocessing as mp
import queue as queue_mod
import time
import weakref

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
        self.results = ctx.Queue()
        self.stop_event = ctx.Event()
        # Replicas (async attention workers, sync ranks) take requests; expert workers take none.
        self.controls = {s.index: ctx.Queue() for s in specs if s.role != "expert"}
        self.procs = {}
        self.early: list = []            # non-Ready messages that arrived during start-up
        for s in specs:
            p = ctx.Process(target=worker_main, name=f"asap-{s.role}{s.index}",
                            args=(s, self.controls.get(s.index), self.results, self.stop_event), daemon=True)
            self.procs[f"{s.role}{s.index}"] = p
        self._finalizer = weakref.finalize(self, Cluster._shutdown, self.procs, self.controls, self.stop_event,
                                           transport_spec)
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
                raise WorkerError(f"worker(s) exited during start-up: {dead}")
            if time.monotonic() > end:
                raise WorkerError(f"workers not ready after {timeout:.0f}s: ranks {sorted(pending)}")
            try:
                msg = self.results.get(timeout=0.2)
            except queue_mod.Empty:
                continue
            if isinstance(msg, Ready):
                pending.discard(msg.rank)
            elif isinstance(msg, Failure):
                raise WorkerError(f"{msg.worker} failed during start-up:\n{msg.error}")
            else:
                self.early.append(msg)

    def dead(self) -> dict[str, int]:
        """Workers that have exited, with their exit codes."""
        return {n: p.exitcode for n, p in self.procs.items() if p.exitcode is not None}

    def close(self) -> None:
        self._finalizer()

    @staticmethod
    def _shutdown(procs, controls, stop_event, transport_spec):
        stop_event.set()
        for q in controls.values():
            try:
                q.put_nowait(Shutdown())
            except Exception:  # noqa: BLE001 - a closed queue during interpreter exit
                pass
        deadline = time.monotonic() + 10
        started = [p for p in procs.values() if p.pid is not None]
        for p in started:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
        for p in started:
            if p.is_alive():
                p.terminate()
                p.join(timeout=2)
            if p.is_alive():
                p.kill()
                p.join(timeout=2)
        try:
            transport_spec.cleanup()
        except Exception:  # noqa: BLE001
            pass
