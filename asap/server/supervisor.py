"""Watches the engine: reports health, restarts the workers when one dies or hangs, trims worker spans.

States: "ok"; "unhealthy" (a worker died, missed its heartbeats, or the engine failed, and it is not
being restarted: auto_restart off, the engine cannot restart, or a restart just
failed and is waiting to retry, or the server is shutting down); "restarting" (engine.restart() is running:
every worker is stopped and started again, reloading its weights; about a second with the tiny
presets). Requests in flight when a worker dies or hangs are failed by the engine itself
(EngineUnavailable: 503 + Retry-After).
"""
from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from asap.engine.errors import EngineClosed

log = logging.getLogger("asap.server")


class Supervisor:
    def __init__(self, llm, auto_restart: bool = True, poll_s: float = 0.1, span_window_s: float = 10.0):
        self.llm, self.poll_s, self.span_window_s = llm, poll_s, span_window_s
        self.can_restart = auto_restart and hasattr(llm.engine, "restart")
        self.status, self.reason, self.num_restarts = "ok", "", 0
        self.draining = False            # set on SIGTERM/SIGINT: a shutting-down server restarts nothing
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="asap-restart")
        self._task: asyncio.Task | None = None

    @property
    def healthy(self) -> bool:
        return self.status == "ok" and self.llm.healthy()

    def workers(self) -> dict[str, dict]:
        cluster = getattr(self.llm.engine, "cluster", None)
        procs = dict(cluster.procs) if cluster is not None else {}
        return {name: {"pid": p.pid, "alive": p.is_alive()} for name, p in procs.items()}

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop watching; waits for a restart in progress so the engine can be closed safely."""
        if self._task is not None:
            self._task.cancel()
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown, True)

    async def _run(self) -> None:
        backoff = 1.0
        while True:
            self._trim_spans()
            try:
                healthy = self.llm.healthy()
            except EngineClosed as e:       # closed by its owner or at shutdown: nothing left to watch
                self.status, self.reason = "unhealthy", str(e)
                return
            if healthy:
                self.status, self.reason, backoff = "ok", "", 1.0
            else:
                self.reason = self.why()
                restart = self.can_restart and not self.draining
                self.status = "restarting" if restart else "unhealthy"
                if restart:
                    await self._let_engine_fail_in_flight()
                    self.reason = self.why()
                    log.warning("engine unhealthy (%s): restarting its workers", self.reason)
                    try:
                        await asyncio.get_running_loop().run_in_executor(self._executor, self.llm.engine.restart)
                        self.num_restarts += 1
                        log.warning("workers restarted (%d restart(s) so far)", self.num_restarts)
                        continue
                    except Exception as e:  # noqa: BLE001 - retried; the reason shows on /health
                        self.status, self.reason = "unhealthy", f"restart failed: {e}"
                        log.error("%s; retrying in %.0fs", self.reason, backoff)
                        await asyncio.sleep(backoff)
                        backoff = min(2 * backoff, 30.0)
            await asyncio.sleep(self.poll_s)

    async def _let_engine_fail_in_flight(self, timeout_s: float = 1.0) -> None:
        """The engine fails its in-flight requests at once when its collector sees a dead worker (and records
        an error); restart() would stop that and leave them to wait for the workers to stop. So wait for it."""
        end = time.monotonic() + timeout_s
        while not getattr(self.llm.engine, "errors", True) and time.monotonic() < end:
            await asyncio.sleep(0.02)

    def why(self) -> str:
        errors = list(getattr(self.llm.engine, "errors", []))
        cluster = getattr(self.llm.engine, "cluster", None)
        dead = cluster.dead() if cluster is not None else {}
        return "; ".join(errors[-3:]) or (f"worker(s) died: {dead}" if dead else "engine stopped")

    def _trim_spans(self) -> None:
        """Keep only the spans the busy/stall gauges can still need (the engine bounds them too)."""
        spans = getattr(self.llm.engine, "spans", None)
        if hasattr(spans, "trim"):
            spans.trim(time.monotonic() - 2 * self.span_window_s)
