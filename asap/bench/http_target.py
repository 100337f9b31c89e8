"""Target for any OpenAI-compatible server, sending what `vllm bench serve` sends.

POST {base_url}{endpoint} (default /v1/completions) with the prompt as token ids
(so the server prefills exactly the workload's tokens), `max_tokens: 1` (or vLLM's --random-output-len),
`stream: true` and `stream_options: {include_usage: true}`. TTFT is taken at
the first SSE chunk that carries `choices`, as vLLM does (its text may be
empty); the end of the stream gives the end-to-end latency, and the `usage`
chunk the output token count. `stream=False` posts a plain request instead,
and the whole response is the first token.

A failed request keeps its reason: a non-2xx status with the start of its body
(OpenAI's error message when it is one), an `error` event inside the stream, a
stream that ends without any chunk, or a transport error.
"""
from __future__ import annotations

import asyncio
import json
import time

import httpx

from asap.measure.metrics import RequestResult
from asap.bench.runner import FirstToken, replay
from asap.scheduler.request import Request


def _reason(response: httpx.Response, text: str) -> str:
    """OpenAI's {"error": {"message"}} when the body is one, else the body's first 200 characters."""
    try:
        message = json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = text[:200]
    return f"HTTP {response.status_code}: {message}"


class HttpTarget:
    def __init__(self, base_url: str, model: str, label: str = "http", timeout: float = 600.0,
                 progress: bool = True, transport: httpx.AsyncBaseTransport | None = None,
                 endpoint: str = "/v1/completions", stream: bool = True, max_concurrency: int | None = None,
                 ignore_eos: bool = False, max_tokens: int = 1):
        """`base_url` like http://host:8000 (or the full .../v1/completions URL); `model` is the
        server's model name (vLLM's --served-model-name); `transport` is for tests."""
        url = base_url.rstrip("/")
        self.url = url if url.endswith("/completions") else url + "/" + endpoint.lstrip("/")
        self.model = model
        self.label = label
        self.timeout = timeout
        self.progress = progress
        self.transport = transport
        self.stream = stream
        self.max_concurrency = max_concurrency
        self.ignore_eos = ignore_eos
        self.max_tokens = max_tokens

    def body(self, req: Request) -> dict:
        body = {"model": self.model, "prompt": req.prompt, "max_tokens": self.max_tokens, "stream": self.stream}
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        if self.ignore_eos:
            body["ignore_eos"] = True
        return body

    async def submit(self, client: httpx.AsyncClient, req: Request) -> FirstToken | None:
        if req.prompt is None:
            raise ValueError(f"request {req.id} has no prompt; build the workload with with_prompts=True")
        if not self.stream:
            response = await client.post(self.url, json=self.body(req))
            if not response.is_success:
                raise RuntimeError(_reason(response, response.text))
            return None
        async with client.stream("POST", self.url, json=self.body(req)) as response:
            if not response.is_success:
                raise RuntimeError(_reason(response, (await response.aread()).decode(errors="replace")))
            return await self._read_stream(response)

    async def _read_stream(self, response: httpx.Response) -> FirstToken:
        first, tokens = None, None
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue                          # blank separators, comments, other fields
            data = line[len("data:"):].strip()
            if data == "[DONE]":
                break
            try:
                chunk = json.loads(data)
            except ValueError:
                raise RuntimeError(f"malformed SSE chunk: {data[:200]!r}") from None
            if not isinstance(chunk, dict):
                raise RuntimeError(f"malformed SSE chunk: {data[:200]!r}")
            if "error" in chunk:
                err = chunk["error"]
                raise RuntimeError(f"error in stream: {err.get('message', err) if isinstance(err, dict) else err}")
            if chunk.get("choices") and first is None:
                first = time.monotonic()
            if isinstance(chunk.get("usage"), dict):
                tokens = chunk["usage"].get("completion_tokens")
        if first is None:
            raise RuntimeError("the stream ended without any chunk carrying choices: no TTFT")
        return FirstToken(first, tokens)

    async def run_async(self, requests: list[Request]) -> list[RequestResult]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=self.timeout, limits=limits, transport=self.transport) as client:
            return await replay(lambda req: self.submit(client, req), requests, self.progress,
                                max_concurrency=self.max_concurrency)

    def run(self, requests: list[Request]) -> list[RequestResult]:
        return asyncio.run(self.run_async(requests))
