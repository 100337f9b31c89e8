"""The FastAPI app: HTTP routes over a PrefillService (service.py). Endpoints and shapes: README.md here.

Every error, ours or the framework's (unknown route, wrong method), has the OpenAI shape
{"error": {"message", "type", "param", "code"}}. Handlers only do I/O: parsing, tokenising, sampling,
building and encoding answers run in the service's thread pool. A completion whose client hangs up
before its answer is cancelled (service.handle, streams.Stream). No URL is built from the request's Host
header: KV URLs come from --public-url, and a trailing slash is a 404, not a redirect that echoes Host.
/docs, /redoc and /openapi.json exist only with --enable-docs.
"""
from __future__ import annotations

import asyncio
import contextlib
import os

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException

import asap
from asap.server.auth import ApiKeyMiddleware, authorized
from asap.server.config import ServerConfig
from asap.server.protocol import ApiError, SafeJSONResponse
from asap.server.service import PrefillService
from asap.server.sse import HEADERS
from asap.server.streams import Stream, until_disconnect
from asap.server.tokens import detokenize, tokenize


def _error(e: ApiError) -> SafeJSONResponse:
    return SafeJSONResponse(e.body(), status_code=e.status, headers=e.headers)


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


async def _unless_disconnected(work, request: Request):
    """Await `work`; cancel it if the client hangs up first (-> None)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(until_disconnect(request.receive))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:      # the server is stopping: stop both
        task.cancel()
        gone.cancel()
        raise
    if task.done():
        gone.cancel()
        return task.result()
    task.cancel()                       # the client left first
    await asyncio.gather(task, return_exceptions=True)      # its clean-up: cancel the engine's work
    return None


def create_app(llm, cfg: ServerConfig, model_name: str, tokenizer=None, public_url: str = "") -> FastAPI:
    """public_url: the address kv_url names (default: cfg.public_url, else cfg.host:cfg.port)."""
    service = PrefillService(llm, cfg, model_name, tokenizer, public_url)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        service.supervisor.start()
        sweeper = asyncio.get_running_loop().create_task(service.sweep_kv())
        yield
        sweeper.cancel()
        service.cut_off()
        await service.supervisor.stop()
        service.pool.shutdown(wait=False, cancel_futures=True)

    docs = {} if cfg.enable_docs else {"docs_url": None, "redoc_url": None, "openapi_url": None}
    app = FastAPI(title="ASAP prefill server", lifespan=lifespan, default_response_class=SafeJSONResponse,
                  redirect_slashes=False, **docs)
    app.state.service = service
    api_key = cfg.api_key or os.environ.get("ASAP_API_KEY", "")
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)

    @app.exception_handler(ApiError)
    async def api_error(request, e: ApiError):
        return _error(e)

    @app.exception_handler(HTTPException)
    async def http_error(request, e: HTTPException):
        return _error(ApiError(e.status_code, str(e.detail), headers=getattr(e, "headers", None)))

    @app.exception_handler(Exception)
    async def unexpected(request, e: Exception):      # a bug of ours: still OpenAI's shape, never a bare 500 page
        return _error(ApiError(500, f"internal error: {type(e).__name__}", kind="server_error"))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request, e):
        return _error(ApiError(400, "invalid request"))

    async def body_of(request: Request) -> bytes:
        try:
            return await _read_body(request, cfg.max_body_kb * 1024)
        except ApiError:
            service.metrics.count("invalid")
            raise

    async def answer(kind: str, request: Request):
        result = await _unless_disconnected(service.handle(kind, await body_of(request)), request)
        if result is None:              # the client is gone: nobody reads this
            return Response(status_code=499)
        if isinstance(result, bytes):
            return Response(result, media_type="application/json")
        chunks, closed = result
        return Stream(chunks, "text/event-stream", HEADERS, on_close=closed)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await answer("completion", request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await answer("chat", request)

    @app.post("/tokenize")
    async def tokenize_route(request: Request):
        return await service.off_loop(tokenize, await body_of(request), service.ctx)

    @app.post("/detokenize")
    async def detokenize_route(request: Request):
        return await service.off_loop(detokenize, await body_of(request), service.ctx)

    @app.get("/v1/kv/{handle}")
    async def claim_kv(handle: str):
        return service.claim_kv(handle)

    @app.get("/health")
    async def health(request: Request):
        body = service.health(full=not api_key or authorized(request.headers.get("authorization", ""), api_key))
        return SafeJSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    def model_card() -> dict:
        return {"id": model_name, "object": "model", "created": 0, "owned_by": "asap", "root": model_name,
                "parent": None, "max_model_len": llm.cfg.max_position_embeddings}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        if model_id != model_name:
            raise ApiError(404, f"model not served here; this server serves {model_name!r}", kind="not_found_error",
                           param="model")
        return model_card()

    @app.get("/version")
    async def version():
        return {"version": getattr(asap, "__version__", "0.1.0")}

    @app.get("/metrics")
    async def prometheus():
        data, content_type = service.metrics.render()
        return Response(data, media_type=content_type)

    return app
