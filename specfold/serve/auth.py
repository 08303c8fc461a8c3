"""`--api-key`: every `/v1/*` request needs `Authorization: Bearer <key>`.

A plain ASGI middleware (it never wraps `receive`, so streaming and disconnect detection behave as
without it). Invariants:
- the check runs before routing: an unknown `/v1/...` path without the key is 401, not 404, and
  nothing about the routes leaks to a client without the key;
- the key is compared in constant time (`hmac.compare_digest` of SHA-256 digests, so neither the
  contents nor the length of the key shows in the timing);
- `/health` and `/metrics` stay open (probes and scrapers), as in vLLM;
- a refusal is 401 with OpenAI's error body (`code: "invalid_api_key"`) and `WWW-Authenticate: Bearer`.
"""
from __future__ import annotations

import hashlib
import hmac
import json


def _digest(text: bytes) -> bytes:
    return hashlib.sha256(text).digest()


class ApiKeyMiddleware:
    def __init__(self, app, api_key: str):
        self.app = app
        self._want = _digest(api_key.encode())

    def _authorized(self, scope) -> bool:
        values = [v for k, v in scope.get("headers", []) if k == b"authorization"]
        if len(values) != 1:
            return False
        scheme, _, token = values[0].partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(_digest(token.strip()), self._want)

    async def __call__(self, scope, receive, send):
        path, root = scope.get("path", ""), scope.get("root_path", "")
        if root and path.startswith(root):  # mounted under a prefix (e.g. a Ray Serve route_prefix)
            path = path[len(root):]
        if scope["type"] != "http" or not (path == "/v1" or path.startswith("/v1/")) or self._authorized(scope):
            return await self.app(scope, receive, send)
        body = json.dumps({"error": {"message": "missing or wrong API key: send 'Authorization: Bearer <key>' "
                                                "(the server's --api-key)", "type": "invalid_request_error",
                                     "param": None, "code": "invalid_api_key"}}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})
