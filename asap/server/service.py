"""The request path of /v1/completions, and the server's live state (admission, KV store, supervisor).

parse and check the body (4xx) -> engine healthy? (503) -> admission slot free? (503 + Retry-After)
-> llm.submit -> await the engine (504 past request_timeout_s; 5xx if the engine fails the request)
-> keep the KV cache under a handle -> 200. Every request is counted once, by outcome.
"""
from __future__ import annotations

import asyncio
import secrets
import time

from asap.engine.runtime import EngineUnhealthy
from asap.scheduler.errors import QueueFull, Rejected
from asap.server.admission import Admission
from asap.server.config import ServerConfig
from asap.server.kv_store import KVStore, kv_metadata, kv_tensors
from asap.server.metrics import ServerMetrics
from asap.server.protocol import ApiError, completion_body, parse_completion
from asap.server.supervisor import Supervisor

RETRY = {"Retry-After": "1"}


class PrefillService:
    def __init__(self, llm, cfg: ServerConfig, model_name: str, tokenizer=None):
        self.llm, self.cfg, self.model_name, self.tokenizer = llm, cfg, model_name, tokenizer
        self.admission = Admission(cfg.max_pending)
        self.kv_store = KVStore(int(cfg.kv_max_mb * 2**20), cfg.kv_ttl_s)
        self.supervisor = Supervisor(llm, cfg.auto_restart, span_window_s=cfg.metrics_window_s)
        self.metrics = ServerMetrics(self.snapshot)

    async def complete(self, body: bytes) -> dict:
        arrival, outcome = time.monotonic(), "failed"
        try:
            req = parse_completion(body, self.llm.cfg, self.tokenizer, self.model_name)
            out = await self._prefill(req.prompt_ids)
            completion_id = "cmpl-" + secrets.token_hex(12)
            kv = self._keep_kv(out, completion_id, len(req.prompt_ids)) if req.return_kv else None
            text = self.tokenizer.decode([out.first_token]) if self.tokenizer is not None else ""
            outcome = "ok"
            self.metrics.ttft.observe(time.monotonic() - arrival)
            return completion_body(completion_id, self.model_name, len(req.prompt_ids), out.first_token, text, kv)
        except ApiError as e:
            outcome = e.outcome
            raise
        finally:
            self.metrics.requests.labels(outcome).inc()

    async def _prefill(self, prompt_ids: list[int]):
        """Admit, submit, await: the engine's PrefillOutput, or an ApiError saying why not."""
        if not self.supervisor.healthy:
            raise ApiError(503, f"engine unhealthy: {self.supervisor.reason or self.supervisor.why()}",
                           kind="unavailable_error", headers=RETRY, outcome="unavailable")
        if not self.admission.try_admit():
            raise ApiError(503, f"overloaded: {self.admission.capacity} requests already pending; retry later",
                           kind="overloaded_error", headers=RETRY, outcome="rejected")
        try:
            future = self.llm.submit(prompt_ids)
        except BaseException:
            self.admission.release()
            raise
        future.add_done_callback(self.admission.release)      # the slot is held until the engine is done
        waiting = asyncio.wrap_future(future)
        done, _ = await asyncio.wait([waiting], timeout=self.cfg.request_timeout_s)   # never cancels the engine's
        if not done:
            waiting.add_done_callback(lambda f: f.cancelled() or f.exception())        # nobody awaits it now
            raise ApiError(504, f"no first token within request_timeout_s={self.cfg.request_timeout_s}",
                           kind="timeout_error", outcome="timeout")
        try:
            return waiting.result()
        except (QueueFull, Rejected) as e:                    # the engine's own bounds (max_queue, SLO admission)
            raise ApiError(503, f"overloaded: {e}", kind="overloaded_error", headers=RETRY,
                           outcome="rejected") from None
        except EngineUnhealthy as e:                          # a worker died: retrying after the restart can work
            raise ApiError(503, f"request failed: {e}", kind="unavailable_error", headers=RETRY,
                           outcome="failed") from None
        except Exception as e:  # noqa: BLE001 - the engine's error, reported to the client
            raise ApiError(500, f"request failed: {type(e).__name__}: {e}", kind="server_error",
                           outcome="failed") from None

    def _keep_kv(self, out, completion_id: str, num_tokens: int) -> dict | None:
        tensors = kv_tensors(out.kv)
        meta = kv_metadata(self.llm.cfg, self.model_name, completion_id, num_tokens, out.first_token)
        handle = self.kv_store.put(tensors, meta)
        if handle is None:
            return None
        return {"id": handle, "url": f"/v1/kv/{handle}", "format": "safetensors",
                "num_bytes": sum(t.nbytes for t in tensors.values()), "expires_in_s": self.cfg.kv_ttl_s}

    def claim_kv(self, handle: str) -> bytes:
        data = self.kv_store.take(handle)
        if data is None:
            raise ApiError(404, f"no KV cache {handle!r}: unknown, already claimed, expired or evicted",
                           kind="not_found_error")
        return data

    def health(self) -> dict:
        sup = self.supervisor
        ok = sup.healthy
        return {"status": "ok" if ok else "unhealthy" if sup.status == "ok" else sup.status,
                "reason": "" if ok else sup.reason or sup.why(), "engine": self.llm.engine_name,
                "model": self.model_name, "restarts": sup.num_restarts, "pending": self.admission.num_pending,
                "workers": sup.workers()}

    def snapshot(self) -> dict:
        """Live values for the Prometheus gauges."""
        self.kv_store.sweep()
        return {"queue_depth": self.admission.num_pending, "queue_capacity": self.admission.capacity,
                "healthy": self.supervisor.healthy, "restarts": self.supervisor.num_restarts,
                "kv_bytes": self.kv_store.num_bytes, "kv_entries": len(self.kv_store),
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
