"""The request path of /v1/completions and /v1/chat/completions, and the server's live state.

parse + tokenise + size the answer (thread pool; 4xx, 400 past --max-response-mb) -> engine healthy?
(503) -> an admission slot per prompt (503 + Retry-After) -> llm.submit each prompt (prefilled
concurrently) -> await the engine (504 past request_timeout_s; 503/500 if the engine fails) -> keep the KV
only when kv_transfer_params asks -> sample, build and JSON-encode the answer in the thread pool -> one
body, or SSE chunks as each prompt finishes (the KV hand-off in the last one).
The event loop only does I/O. A request that ends early (client gone: "aborted"; 504; an error) cancels
the engine futures it still waits on, which aborts that work in the engine. Every request is counted
once, by outcome.
"""
from __future__ import annotations

import asyncio
import secrets
import time
from concurrent.futures import ThreadPoolExecutor

from asap.engine.errors import EngineClosed, EngineUnavailable
from asap.scheduler.errors import QueueFull, Rejected
from asap.server import responses as R
from asap.server.admission import Admission
from asap.server.answers import Answer, usage
from asap.server.chat import load_chat_template
from asap.server.config import ServerConfig
from asap.server.kv_store import KVStore, kv_metadata, kv_tensors, stream_chunks, stream_size, transfer_params
from asap.server.metrics import ServerMetrics
from asap.server.params import generation_defaults
from asap.server.protocol import ApiError
from asap.server.requests import Context, Job, parse_chat, parse_completion
from asap.server.sse import DONE, error_event, event
from asap.server.streams import Stream
from asap.server.supervisor import Supervisor
from asap.server.tokens import text_byte_cap

RETRY = {"Retry-After": "1"}


def _follow(future):
    """An asyncio future that takes the engine future's outcome unless it was answered first (cut_off).

    Not asyncio.wrap_future: a wrapped future must not be completed by anyone else (asyncio asserts when the
    engine's result arrives later). The engine's future is cancelled explicitly (PrefillService._abandon)."""
    loop = asyncio.get_running_loop()
    wait = loop.create_future()

    def copy(f):
        if wait.done():
            return
        if f.cancelled():
            wait.cancel()
        elif f.exception() is not None:
            wait.set_exception(f.exception())
        else:
            wait.set_result(f.result())

    def done(f):                # in the engine's thread
        try:
            loop.call_soon_threadsafe(copy, f)
        except RuntimeError:    # the loop is closed: nobody waits any more
            pass

    future.add_done_callback(done)
    return wait


class PrefillService:
    def __init__(self, llm, cfg: ServerConfig, model_name: str, tokenizer=None, public_url: str = ""):
        self.llm, self.cfg, self.model_name, self.tokenizer = llm, cfg, model_name, tokenizer
        host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
        self.public_url = (public_url or cfg.public_url or f"http://{host}:{cfg.port}").rstrip("/")
        self.max_response_bytes = int(cfg.max_response_mb * 2**20)
        self.admission = Admission(cfg.max_pending)
        self.kv_store = KVStore(int(cfg.kv_max_mb * 2**20), cfg.kv_ttl_s)
        self.supervisor = Supervisor(llm, cfg.auto_restart, span_window_s=cfg.metrics_window_s)
        self.metrics = ServerMetrics(self.snapshot, model_name)
        self.pool = ThreadPoolExecutor(cfg.parse_threads, thread_name_prefix="asap-parse")
        model_dir = getattr(llm, "model_dir", None)
        self.ctx = Context(llm.cfg, tokenizer, model_name, text_byte_cap(tokenizer, llm.cfg), cfg.max_pending,
                           generation_defaults(model_dir) if model_dir else {},
                           load_chat_template(tokenizer))
        self.engine_id = "asap-" + secrets.token_hex(8)
        self._waiting: set[asyncio.Future] = set()

    async def off_loop(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def sweep_kv(self) -> None:
        """Free expired KV caches on a timer, not only when the store is next touched."""
        period = max(0.05, min(1.0, self.cfg.kv_ttl_s / 2))
        while True:
            await asyncio.sleep(period)
            self.kv_store.sweep()

    # ---- the request path -----------------------------------------------------------------------
    def _parse(self, kind: str, body: bytes) -> Job:
        """In the thread pool: the Job, or 400 when its answer would be over --max-response-mb."""
        job = (parse_completion if kind == "completion" else parse_chat)(body, self.ctx)
        size = R.estimated_bytes(job)
        if size > self.max_response_bytes:
            raise R.too_big(size, self.cfg.max_response_mb)
        return job

    def _answer(self, rid: str) -> Answer:
        return Answer(rid, self.model_name, self.tokenizer, self.cfg.max_response_mb)

    async def handle(self, kind: str, body: bytes):
        """-> the encoded response body (bytes), or, when the request streams, (an async iterator of SSE bytes,
        a function to call once the response is over). Cancelling the call (the client hung up) cancels the
        engine's work and counts the request aborted."""
        arrival = time.monotonic()
        try:
            job = await self.off_loop(self._parse, kind, body)
            futures, waits = self._submit_all(job)
        except ApiError as e:
            self.metrics.count(e.outcome)
            raise
        except asyncio.CancelledError:
            self.metrics.count("aborted")
            raise
        rid = ("cmpl-" if kind == "completion" else "chatcmpl-") + secrets.token_hex(12)
        if job.common.stream:
            ran = []

            def closed():               # a stream cancelled before it began never ran its own clean-up
                if not ran:
                    self._abandon(futures)
                    self.metrics.finish("aborted", arrival, sum(map(len, job.prompts)))
            return self._stream(job, rid, futures, waits, arrival, ran), closed
        outcome = "failed"
        try:
            outs = await self._await_all(waits)
            for out in outs:
                self.metrics.observe_first_token(out, arrival)
            kv = await self._keep_kv(job, outs[0], rid) if job.common.keep_kv else None
            data = await self.off_loop(self._answer(rid).encode, job, outs, kv)
            outcome = "ok"
            return data
        except ApiError as e:
            outcome = e.outcome
            raise
        except asyncio.CancelledError:
            outcome = "aborted"
            raise
        finally:
            self._abandon(futures)
            self.metrics.finish(outcome, arrival, sum(map(len, job.prompts)))

    async def _stream(self, job: Job, rid: str, futures: list, waits: list, arrival: float, ran: list):
        outcome, sent, kv = "failed", 0, None
        ran.append(True)
        try:
            pending = {w: i for i, w in enumerate(waits)}
            end = time.monotonic() + self.cfg.request_timeout_s
            while pending:
                done, _ = await asyncio.wait(pending, timeout=max(0.0, end - time.monotonic()),
                                             return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    raise self._timeout()
                for w in done:
                    i = pending.pop(w)
                    out = self._result(w)
                    self.metrics.observe_first_token(out, arrival)
                    if job.common.keep_kv:                      # one prompt only (requests.py)
                        kv = await self._keep_kv(job, out, rid)
                    for data in await self.off_loop(self._answer(rid).events, job, i, out, kv):
                        sent += len(data)
                        if sent > self.max_response_bytes:
                            raise R.too_big(sent, self.cfg.max_response_mb, measured=True)
                        yield data
            if job.common.include_usage:
                yield event(R.chunk(job.kind, rid, self.model_name, [], self.tokenizer, usage(job), True, kv))
            outcome = "ok"
        except ApiError as e:
            outcome = e.outcome
            yield error_event(e)
        except (asyncio.CancelledError, GeneratorExit):     # the client went (streams.Stream cancels us)
            outcome = "aborted"
            raise
        finally:
            self._abandon(futures)
            self.metrics.finish(outcome, arrival, sum(map(len, job.prompts)))
        yield DONE

    def _engine_healthy(self) -> bool:
        """A closed engine raises EngineClosed from healthy(): it is simply not healthy."""
        try:
            return self.supervisor.healthy
        except EngineClosed:
            return False

    @staticmethod
    def _closed(e: EngineClosed) -> ApiError:
        return ApiError(503, f"engine unavailable: {e}", kind="unavailable_error", headers=RETRY, outcome="unavailable")

    def _submit_all(self, job: Job) -> tuple[list, list[asyncio.Future]]:
        """-> (the engine's futures, the loop's futures following them)."""
        try:
            healthy = self.supervisor.healthy
        except EngineClosed as e:           # closed (shutting down, or by its owner): 503, never a 500
            raise self._closed(e) from None
        if not healthy:
            raise ApiError(503, f"engine unhealthy: {self.supervisor.reason or self.supervisor.why()}",
                           kind="unavailable_error", headers=RETRY, outcome="unavailable")
        futures, waits = [], []
        try:
            for ids in job.prompts:
                if not self.admission.try_admit():
                    raise ApiError(503, f"overloaded: {self.admission.capacity} requests already pending; retry "
                                        "later", kind="overloaded_error", headers=RETRY, outcome="rejected")
                try:
                    k = job.prompt_logprobs
                    future = self.llm.submit(ids) if k is None else self.llm.submit(ids, prompt_logprobs=k)
                except EngineClosed as e:       # closed since the health check
                    self.admission.release()
                    raise self._closed(e) from None
                except BaseException:
                    self.admission.release()
                    raise
                future.add_done_callback(self.admission.release)      # held until the engine is done (or aborted)
                wait = _follow(future)
                wait.add_done_callback(lambda f: f.cancelled() or f.exception())   # retrieved even if abandoned
                self._waiting.add(wait)
                wait.add_done_callback(self._waiting.discard)
                futures.append(future)
                waits.append(wait)
        except BaseException:
            self._abandon(futures)          # a batch refused part-way: its admitted prompts are not run
            raise
        return futures, waits

    @staticmethod
    def _abandon(futures: list) -> None:
        """Cancel the engine's work nobody will read (a no-op for the futures already answered)."""
        for future in futures:
            future.cancel()

    async def _await_all(self, waits: list) -> list:
        done, _ = await asyncio.wait(waits, timeout=self.cfg.request_timeout_s)
        if len(done) < len(waits):
            raise self._timeout()
        return [self._result(w) for w in waits]

    def _timeout(self) -> ApiError:
        return ApiError(504, f"no first token within request_timeout_s={self.cfg.request_timeout_s}",
                        kind="timeout_error", outcome="timeout")

    @staticmethod
    def _result(wait):
        try:
            return wait.result()
        except ApiError:
            raise
        except asyncio.CancelledError:                        # its engine future was cancelled under it
            raise ApiError(503, "request cancelled", kind="unavailable_error", headers=RETRY,
                           outcome="unavailable") from None
        except (QueueFull, Rejected) as e:                    # the engine's own bounds (max_queue, SLO admission)
            raise ApiError(503, f"overloaded: {e}", kind="overloaded_error", headers=RETRY,
                           outcome="rejected") from None
        except Exception as e:  # noqa: BLE001 - the engine's error, reported to the client
            if isinstance(e, (EngineUnavailable, EngineClosed)):    # retry after the restart, or elsewhere
                retry = {"Retry-After": str(getattr(e, "retry_after_s", 1))}
                raise ApiError(503, f"request failed: {e}", kind="unavailable_error", headers=retry,
                               outcome="failed") from None
            raise ApiError(500, f"request failed: {type(e).__name__}: {e}", kind="server_error",
                           outcome="failed") from None

    def cut_off(self, why: str = "server shutting down") -> None:
        """Answer every request still waiting on the engine with 503 (shutdown past its grace period)."""
        for wait in list(self._waiting):
            if not wait.done():
                wait.set_exception(ApiError(503, f"request cut off: {why}", kind="unavailable_error",
                                            headers=RETRY, outcome="unavailable"))

    async def _keep_kv(self, job: Job, out, rid: str) -> dict | None:
        tensors = await self.off_loop(kv_tensors, out.kv)
        meta = kv_metadata(self.llm.cfg, self.model_name, rid, len(job.prompts[0]), out.first_token)
        handle = self.kv_store.put(tensors, meta)
        if handle is None:
            return None
        return transfer_params(handle, self.public_url, self.engine_id, len(job.prompts[0]),
                               sum(t.nbytes for t in tensors.values()), self.cfg.kv_ttl_s)

    def claim_kv(self, handle: str) -> Stream:
        """The cache as a streamed safetensors file; it stays counted against --kv-max-mb until sent or
        abandoned (the client went, or took no data for --kv-write-timeout-s)."""
        entry = self.kv_store.take(handle)
        if entry is None:
            raise ApiError(404, "no such KV cache: unknown, already claimed, expired or evicted",
                           kind="not_found_error")

        async def chunks():             # each piece is one 1 MiB copy: cheap enough for the loop
            for piece in stream_chunks(entry):
                yield piece
        return Stream(chunks(), "application/octet-stream", {"content-length": str(stream_size(entry))},
                      write_timeout_s=self.cfg.kv_write_timeout_s, on_close=lambda: self.kv_store.release(handle))

    # ---- live state -----------------------------------------------------------------------------
    def health(self, full: bool = True) -> dict:
        """full=False (a caller without the API key): the status alone, no pids or failure reasons."""
        sup = self.supervisor
        ok = self._engine_healthy()
        status = "ok" if ok else "unhealthy" if sup.status == "ok" else sup.status
        if not full:
            return {"status": status}
        return {"status": status, "reason": "" if ok else sup.reason or sup.why(), "engine": self.llm.engine_name,
                "model": self.model_name, "restarts": sup.num_restarts, "pending": self.admission.num_pending,
                "workers": sup.workers()}

    def snapshot(self) -> dict:
        """Live values for the Prometheus gauges."""
        self.kv_store.sweep()
        running = getattr(self.llm.engine, "num_running", None)
        num_running = min(running(), self.admission.num_pending) if callable(running) else self.admission.num_pending
        return {"running": num_running, "waiting": self.admission.num_pending - num_running,
                "queue_capacity": self.admission.capacity,
                "healthy": self._engine_healthy(), "restarts": self.supervisor.num_restarts,
                "kv_bytes": self.kv_store.num_bytes, "kv_entries": len(self.kv_store),
                "kv_stored": self.kv_store.num_stored, "kv_claimed": self.kv_store.num_claimed,
                "kv_evicted": dict(self.kv_store.num_evicted), "workers": self._worker_fractions()}

    def _worker_fractions(self) -> dict:
        fractions = getattr(self.llm.engine, "worker_fractions", None)
        if fractions is None:
            return {}
        now = time.monotonic()
        try:
            return fractions(now - self.cfg.metrics_window_s, now)
        except RuntimeError:           # the engine's thread added a worker while we read: skip this scrape
            return {}
