"""The FastAPI app: HTTP routes over a PrefillService (service.py). Endpoints and shapes: README.md here.

Every error, ours or the framework's (unknown route, wrong method), has the OpenAI shape
{"error": {"message", "type", "param", "code"}}.
"""
from __future__ import annotations

import contextlib

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from asap.server.config import ServerConfig
from asap.server.protocol import ApiError
from asap.server.service import PrefillService


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
    service = PrefillService(llm, cfg, model_name, tokenizer)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        service.supervisor.start()
        yield
        await service.supervisor.stop()

    app = FastAPI(title="ASAP prefill server", lifespan=lifespan)
    app.state.service = service

    @app.exception_handler(ApiError)
    async def api_error(request, e: ApiError):
        return _error(e)

    @app.exception_handler(HTTPException)
    async def http_error(request, e: HTTPException):
        return _error(ApiError(e.status_code, str(e.detail), headers=getattr(e, "headers", None)))

    @app.post("/v1/completions")
    async def completions(request: Request):
        try:
            body = await _read_body(request, cfg.max_body_kb * 1024)
        except ApiError:
            service.metrics.requests.labels("invalid").inc()
            raise
        return await service.complete(body)

    @app.get("/v1/kv/{handle}")
    async def claim_kv(handle: str):
        return Response(service.claim_kv(handle), media_type="application/octet-stream",
                        headers={"Content-Disposition": f'attachment; filename="{handle}.safetensors"'})

    @app.get("/health")
    async def health():
        body = service.health()
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "asap",
                                            "max_model_len": llm.cfg.max_position_embeddings}]}

    @app.get("/metrics")
    async def prometheus():
        data, content_type = service.metrics.render()
        return Response(data, media_type=content_type)

    return app
