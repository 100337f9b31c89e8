"""`--api-key` (or ASAP_API_KEY), as vLLM has it: every endpoint but /health needs
`Authorization: Bearer KEY`; otherwise 401 in OpenAI's error shape. A pure ASGI middleware, so
streamed responses pass through untouched."""
from __future__ import annotations

import hmac

from asap.server.protocol import ApiError, dumps

OPEN_PATHS = ("/health",)


class ApiKeyMiddleware:
    def __init__(self, app, api_key: str):
        self.app, self.expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or scope["method"] == "OPTIONS":
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"authorization", b"")
        if hmac.compare_digest(given, self.expected):
            return await self.app(scope, receive, send)
        body = dumps(ApiError(401, "missing or wrong API key: send `Authorization: Bearer <key>`",
                              kind="authentication_error").body()).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})
