"""API keys: ``Authorization: Bearer KEY`` on the protected routes, checked before anything else runs.

A pure ASGI middleware, so a refused request costs no body read, no parsing and no model work, and
every route under a protected prefix is covered without each one remembering a dependency. Probes
(``/health``, ``/ready``) and ``/metrics`` stay open for orchestrators and scrapers. Keys are compared
in constant time and never logged.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from mmencode.app.engine.errors import InvalidRequest
from mmencode.app.http.context import context_of
from mmencode.app.http.errors import error_response
from mmencode.app.metrics import Metrics

__all__ = ["PROTECTED_PATHS", "ApiKeyMiddleware", "InvalidApiKey", "is_protected"]


class InvalidApiKey(InvalidRequest):
    """401 with OpenAI's code, so OpenAI clients raise their ``AuthenticationError``."""

    status = 401
    code = "invalid_api_key"


# What a key guards. An entry ending in "/" guards every path under it; any other entry is one exact
# path (e.g. a peer protocol's "/encode"). Add routes here when they are added to the app.
PROTECTED_PATHS: tuple[str, ...] = ("/v1/",)


def is_protected(path: str, protected: Sequence[str] = PROTECTED_PATHS) -> bool:
    return any(path.startswith(entry) if entry.endswith("/") else path == entry for entry in protected)


class ApiKeyMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        keys: Sequence[str],
        metrics: Metrics,
        protected: Sequence[str] = PROTECTED_PATHS,
    ) -> None:
        if not keys:
            raise ValueError("ApiKeyMiddleware needs at least one key")
        self.app = app
        self._keys = [key.encode() for key in keys]
        self.metrics = metrics
        self.protected = tuple(protected)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_protected(scope["path"], self.protected):
            await self.app(scope, receive, send)
            return
        error = self._refusal(Headers(scope=scope).get("authorization"))
        if error is None:
            await self.app(scope, receive, send)
            return
        await error_response(error, context_of(scope), self.metrics)(scope, receive, send)

    def _refusal(self, authorization: str | None) -> InvalidApiKey | None:
        scheme, _, token = (authorization or "").strip().partition(" ")
        if not authorization or scheme.lower() != "bearer" or not token.strip():
            return _invalid("this service requires an API key: send the header `Authorization: Bearer <key>`")
        candidate = token.strip().encode()
        # Every key is compared, each in constant time: neither the timing nor the count of
        # comparisons tells how much of a guess was right or which key it was close to.
        matched = False
        for key in self._keys:
            matched |= hmac.compare_digest(candidate, key)
        return None if matched else _invalid("the API key is not valid")


def _invalid(message: str) -> InvalidApiKey:
    return InvalidApiKey(message, param="Authorization", headers={"WWW-Authenticate": "Bearer"})
