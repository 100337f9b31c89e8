"""Server-sent events as OpenAI streams them: `data: {json}\\n\\n` per chunk, then `data: [DONE]\\n\\n`.

An error after the stream has started cannot change the status any more, so it travels as one
`data: {"error": {...}}` event (OpenAI's shape) before [DONE], as vLLM does.
"""
from __future__ import annotations

from asap.server.protocol import ApiError, dumps

DONE = b"data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def event(obj) -> bytes:
    return f"data: {dumps(obj)}\n\n".encode()


def error_event(e: ApiError) -> bytes:
    return event(e.body())
