"""Connection limits for `asap serve`, where uvicorn has none of its own.

uvicorn closes idle keep-alive connections (timeout_keep_alive) but never times out a connection
that is slow to send its request (slowloris: nothing, or a header byte now and then), and its
limit_concurrency answers in plain text. GuardedH11Protocol, uvicorn's h11 protocol plus:
  - header_timeout_s: from connect (or the end of the previous response) to the end of the headers;
  - body_timeout_s: from the end of the headers to the end of the body;
  - max_connections: a connection beyond it gets a 503 JSON and is closed.
Deadlines are totals, not idle timers: trickling a byte a second does not extend them.

ShutdownGuard (ASGI): past --shutdown-timeout-s uvicorn cancels the requests still running; they
answer 503 JSON (OpenAI's error shape, Retry-After) instead of a plain-text 500 and a CancelledError
traceback. A client that went away mid-body, or stopped reading a KV pull (streams.SlowClient), is no
error of ours: no traceback either (uvicorn closes the connection).
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import h11
from starlette.requests import ClientDisconnect
from uvicorn.protocols.http.h11_impl import H11Protocol

from asap.config import _f
from asap.server.protocol import ApiError, dumps
from asap.server.streams import SlowClient

log = logging.getLogger("asap.server")


@dataclass(frozen=True)
class ConnectionConfig:
    header_timeout_s: float = _f(10.0, "a connection must send a request's headers within this long, or it is closed")
    body_timeout_s: float = _f(30.0, "a connection must send a request's body within this long after its headers")
    keep_alive_s: float = _f(5.0, "an idle keep-alive connection is closed after this long")
    max_connections: int = _f(1024, "open connections at most; one more gets 503 and is closed")

    def __post_init__(self):
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")


def _raw_response(e: ApiError) -> bytes:
    body = dumps(e.body()).encode()
    head = [f"HTTP/1.1 {e.status} Service Unavailable", "content-type: application/json",
            f"content-length: {len(body)}", "connection: close", *(f"{k}: {v}" for k, v in (e.headers or {}).items())]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def guarded_protocol(limits: ConnectionConfig) -> type:
    """The protocol class to give uvicorn.Config(http=...)."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits})


class GuardedH11Protocol(H11Protocol):
    limits = ConnectionConfig()

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._deadline, self._phase, self._refused = None, None, False
        if len(self.connections) > self.limits.max_connections:
            self._refuse()
        else:
            self._arm()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return                      # read and dropped, so closing does not reset the 503 away
        super().data_received(data)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def connection_lost(self, exc) -> None:
        self._set_deadline(None)
        super().connection_lost(exc)

    def _arm(self) -> None:
        """Start the deadline of the phase the client is in (headers or body) when it enters it."""
        state = self.conn.their_state
        phase = "headers" if state is h11.IDLE else "body" if state is h11.SEND_BODY else None
        if phase != self._phase and not self.transport.is_closing():
            self._phase = phase
            limit = self.limits.header_timeout_s if phase == "headers" else self.limits.body_timeout_s
            self._set_deadline(self.loop.call_later(limit, self._expire, phase, limit) if phase else None)

    def _set_deadline(self, handle) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = handle

    def _expire(self, phase: str, limit: float) -> None:
        if self.transport.is_closing():
            return
        log.info("closed a connection from %s: request %s not received within %gs", self.client, phase, limit)
        self.transport.close()          # a body in progress: the app sees the client disconnect

    def _refuse(self) -> None:
        self._refused = True
        self.connections.discard(self)  # not counted, and not waited for by a shutdown
        log.warning("refused a connection from %s: %d open (max_connections)", self.client, len(self.connections))
        e = ApiError(503, f"too many open connections (max_connections={self.limits.max_connections}); retry later",
                     kind="overloaded_error", headers={"retry-after": "1"})
        self.transport.write(_raw_response(e))
        self.loop.call_later(1.0, self.transport.close)


class ShutdownGuard:
    """Outermost ASGI wrapper: a request cancelled by shutdown answers 503 JSON; a vanished client is quiet."""

    def __init__(self, app):
        self.app = app

    def __getattr__(self, name):         # app.state etc. stay reachable through the wrapper
        return getattr(self.app, name)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracked(message):
            nonlocal started
            started |= message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except asyncio.CancelledError:    # uvicorn cancels a request only to stop the server: answer, then end
            if not started:
                e = ApiError(503, "server shutting down: the request did not finish within shutdown_timeout_s; "
                                  "retry", kind="unavailable_error", headers={"retry-after": "1"})
                await send({"type": "http.response.start", "status": 503,
                            "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1"),
                                        (b"connection", b"close")]})
                await send({"type": "http.response.body", "body": dumps(e.body()).encode()})
        except ClientDisconnect:
            pass
        except SlowClient as e:
            log.info("abandoned a response to %s: %s", scope.get("client"), e)
