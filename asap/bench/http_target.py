"""Target for any OpenAI-compatible server: POST /v1/completions with max_tokens=1.

The prompt is sent as token ids, so the server prefills exactly the
workload's tokens. The response completing is the first token (prefill done).
A non-2xx status or a transport error is a failed request.
"""
from __future__ import annotations

import asyncio

import httpx

from asap.bench.metrics import RequestResult
from asap.bench.runner import replay
from asap.scheduler.request import Request


class HttpTarget:
    def __init__(self, base_url: str, model: str, label: str = "http", timeout: float = 600.0,
                 progress: bool = True, transport: httpx.AsyncBaseTransport | None = None):
        """`base_url` like http://host:8000 (or the full .../v1/completions URL);
        `transport` is for tests (httpx.MockTransport)."""
        url = base_url.rstrip("/")
        self.url = url if url.endswith("/completions") else url + "/v1/completions"
        self.model = model
        self.label = label
        self.timeout = timeout
        self.progress = progress
        self.transport = transport

    async def submit(self, client: httpx.AsyncClient, req: Request) -> None:
        if req.prompt is None:
            raise ValueError(f"request {req.id} has no prompt; build the workload with with_prompts=True")
        body = {"model": self.model, "prompt": req.prompt, "max_tokens": 1, "stream": False}
        response = await client.post(self.url, json=body)
        if not response.is_success:
            raise RuntimeError(f"HTTP {response.status_code}: {response.text[:200]}")

    async def run_async(self, requests: list[Request]) -> list[RequestResult]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=self.timeout, limits=limits, transport=self.transport) as client:
            return await replay(lambda req: self.submit(client, req), requests, self.progress)

    def run(self, requests: list[Request]) -> list[RequestResult]:
        return asyncio.run(self.run_async(requests))
