"""`--api-key` (or ASAP_API_KEY), as vLLM has it: every endpoint but /health needs
`Authorization: Bearer KEY` (the scheme in any case, as RFC 9110 says; the key compared in constant
time); otherwise 401 in OpenAI's error shape. A pure ASGI middleware, so streamed responses pass
through untouched. /health answers anyone, but only a caller with the key sees more than its status.
"""
from __future__ import annotations

import hmac

from asap.server.protocol import ApiError, dumps

OPEN_PATHS = ("/health",)


def authorized(header: str | bytes, api_key: str) -> bool:
    """Does an Authorization header value carry `Bearer <api_key>`?"""
    if isinstance(header, bytes):
        header = header.decode("latin-1")
    scheme, _, token = header.strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode("latin-1", "replace"),
                                                              api_key.encode())


class ApiKeyMiddleware:
    def __init__(self, app, api_key: str):
        self.app, self.api_key = app, api_key

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or scope["method"] == "OPTIONS":
            return await self.app(scope, receive, send)
        if authorized(dict(scope["headers"]).get(b"authorization", b""), self.api_key):
            return await self.app(scope, receive, send)
        body = dumps(ApiError(401, "missing or wrong API key: send `Authorization: Bearer <key>`",
                              kind="authentication_error").body()).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})
