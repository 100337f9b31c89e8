"""Streamed responses that stop the moment their client goes: SSE answers and KV pulls.

uvicorn tells an app that its client hung up only through receive() (an `http.disconnect`), which an
app busy awaiting the engine never calls. `until_disconnect` waits for it; `Stream` runs the body's
async iterator in a task that it cancels as soon as the client is gone, so the iterator's own clean-up
(cancel the engine's work, free a KV cache) runs at once, not when a later write fails. A write that
takes longer than `write_timeout_s` (a client that stopped reading) ends the response too.
"""
from __future__ import annotations

import asyncio

from starlette.responses import Response


class SlowClient(Exception):
    """The client did not take a chunk within the write timeout; the response is abandoned."""


async def until_disconnect(receive) -> None:
    """Returns once the client has closed its connection (the request body must have been read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class Stream(Response):
    """An ASGI response from an async iterator of bytes (a Response subclass, so FastAPI passes it through)."""

    def __init__(self, chunks, media_type: str, headers: dict | None = None, write_timeout_s: float | None = None,
                 on_close=None):
        self.chunks, self.write_timeout_s, self.on_close = chunks, write_timeout_s, on_close
        self.status_code, self.background, self.media_type = 200, None, media_type
        self.init_headers({**(headers or {}), "content-type": media_type})

    async def __call__(self, scope, receive, send) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            pump = asyncio.ensure_future(self._pump(send))
            gone = asyncio.ensure_future(until_disconnect(receive))
            try:
                await asyncio.wait({pump, gone}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (pump, gone):
                    task.cancel()       # cancelling the pump throws CancelledError into the iterator's await
                await asyncio.gather(pump, gone, return_exceptions=True)
                aclose = getattr(self.chunks, "aclose", None)
                if aclose is not None:  # an iterator paused at a yield gets GeneratorExit there
                    await aclose()
            if not pump.cancelled() and pump.exception() is not None:
                raise pump.exception()
        finally:
            if self.on_close is not None:
                self.on_close()

    async def _pump(self, send) -> None:
        async for chunk in self.chunks:
            await self._send(send, {"type": "http.response.body", "body": chunk, "more_body": True})
        await self._send(send, {"type": "http.response.body", "body": b"", "more_body": False})

    async def _send(self, send, message) -> None:
        if self.write_timeout_s is None:
            return await send(message)
        try:
            await asyncio.wait_for(send(message), self.write_timeout_s)
        except asyncio.TimeoutError:
            raise SlowClient(f"client took no data for {self.write_timeout_s:g}s") from None
