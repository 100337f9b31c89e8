"""The FastAPI app: routes over one `asap.LLM`. Endpoints and shapes: asap/server/README.md.

Request path of POST /v1/completions: read the body (bounded) -> parse and
check it (4xx) -> engine healthy? (503) -> admission slot free? (503 +
Retry-After) -> llm.submit -> await the future (504 past request_timeout_s,
5xx if the engine fails it) -> keep the KV cache under a handle -> 200.
Every request is counted once, by outcome, in asap_requests_total.
"""
from __future__ import annotations

import asyncio
import contextlib
import secrets
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from asap.engine.runtime import EngineUnhealthy
from asap.server.admission import Admission
from asap.server.config import ServerConfig
from asap.server.kv_store import KVStore, kv_metadata, kv_tensors
from asap.server.metrics import ServerMetrics
from asap.server.protocol import ApiError, completion_body, parse_completion
from asap.server.supervisor import Supervisor

RETRY_AFTER_S = "1"


def _error(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"request body over {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"request body over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(llm, cfg: ServerConfig, model_name: str, tokenizer=None) -> FastAPI:
    admission = Admission(cfg.max_pending)
    kv_store = KVStore(int(cfg.kv_max_mb * 2**20), cfg.kv_ttl_s)
    supervisor = Supervisor(llm, cfg.auto_restart, span_window_s=cfg.metrics_window_s)

    def snapshot() -> dict:
        kv_store.sweep()
        return {"queue_depth": admission.num_pending, "queue_capacity": admission.capacity,
                "healthy": supervisor.healthy, "restarts": supervisor.num_restarts, "kv_bytes": kv_store.num_bytes,
                "kv_entries": len(kv_store), "kv_evicted": dict(kv_store.num_evicted), "workers": _fractions()}

    def _fractions() -> dict:
        fractions = getattr(llm.engine, "worker_fractions", None)
        if fractions is None:
            return {}
        now = time.monotonic()
        with contextlib.suppress(RuntimeError):    # the engine thread added a worker mid-read: skip a scrape
            return fractions(now - cfg.metrics_window_s, now)
        return {}

    metrics = ServerMetrics(snapshot)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        supervisor.start()
        yield
        await supervisor.stop()

    app = FastAPI(title="ASAP prefill server", lifespan=lifespan)
    app.state.admission, app.state.kv_store, app.state.supervisor = admission, kv_store, supervisor

    @app.exception_handler(ApiError)
    async def api_error(request, e: ApiError):
        return _error(e)

    @app.exception_handler(HTTPException)
    async def http_error(request, e: HTTPException):      # unknown route, wrong method: same error shape
        return _error(ApiError(e.status_code, str(e.detail), headers=getattr(e, "headers", None)))

    @app.post("/v1/completions")
    async def completions(request: Request):
        arrival, outcome = time.monotonic(), "invalid"
        try:
            req = parse_completion(await _read_body(request, cfg.max_body_kb * 1024), llm.cfg, tokenizer, model_name)
            if not supervisor.healthy:
                outcome = "unavailable"
                raise ApiError(503, f"engine unhealthy: {supervisor.reason or supervisor.why()}", kind="unavailable_error",
                               headers={"Retry-After": RETRY_AFTER_S})
            if not admission.try_admit():
                outcome = "rejected"
                raise ApiError(503, f"overloaded: {admission.capacity} requests already pending; retry later",
                               kind="overloaded_error", headers={"Retry-After": RETRY_AFTER_S})
            outcome = "failed"
            future = llm.submit(req.prompt_ids)
            future.add_done_callback(admission.release)
            waiting = asyncio.wrap_future(future)
            done, _ = await asyncio.wait([waiting], timeout=cfg.request_timeout_s)   # never cancels the engine's
            if not done:
                waiting.add_done_callback(lambda f: f.cancelled() or f.exception())   # nobody awaits it now
                outcome = "timeout"
                raise ApiError(504, f"no first token within request_timeout_s={cfg.request_timeout_s}",
                               kind="timeout_error")
            try:
                out = waiting.result()
            except EngineUnhealthy as e:
                raise ApiError(503, f"request failed: {e}", kind="unavailable_error",
                               headers={"Retry-After": RETRY_AFTER_S}) from None
            except Exception as e:  # noqa: BLE001 - the engine's error, reported to the client
                raise ApiError(500, f"request failed: {type(e).__name__}: {e}", kind="server_error") from None
            completion_id = "cmpl-" + secrets.token_hex(12)
            n = len(req.prompt_ids)
            kv = None
            if req.return_kv:
                tensors = kv_tensors(out.kv)
                handle = kv_store.put(tensors, kv_metadata(llm.cfg, model_name, completion_id, n, out.first_token))
                if handle is not None:
                    kv = {"id": handle, "url": f"/v1/kv/{handle}", "format": "safetensors",
                          "num_bytes": sum(t.nbytes for t in tensors.values()), "expires_in_s": cfg.kv_ttl_s}
            text = tokenizer.decode([out.first_token]) if tokenizer is not None else ""
            outcome = "ok"
            metrics.ttft.observe(time.monotonic() - arrival)
            return completion_body(completion_id, model_name, n, out.first_token, text, kv)
        finally:
            metrics.requests.labels(outcome).inc()

    @app.get("/v1/kv/{handle}")
    async def claim_kv(handle: str):
        data = kv_store.take(handle)
        if data is None:
            raise ApiError(404, f"no KV cache {handle!r}: unknown, already claimed, expired or evicted",
                           kind="not_found_error")
        return Response(data, media_type="application/octet-stream",
                        headers={"Content-Disposition": f'attachment; filename="{handle}.safetensors"'})

    @app.get("/health")
    async def health():
        ok = supervisor.healthy
        status = "ok" if ok else "unhealthy" if supervisor.status == "ok" else supervisor.status
        body = {"status": status, "reason": "" if ok else supervisor.reason or supervisor.why(),
                "engine": llm.engine_name, "model": model_name, "restarts": supervisor.num_restarts,
                "pending": admission.num_pending, "workers": supervisor.workers()}
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "asap",
                                            "max_model_len": llm.cfg.max_position_embeddings}]}

    @app.get("/metrics")
    async def prometheus():
        data, content_type = metrics.render()
        return Response(data, media_type=content_type)

    return app
