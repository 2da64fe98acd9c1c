"""API keys: ``Authorization: Bearer KEY`` on the protected routes, checked before anything else runs.

A pure ASGI middleware, so a refused request costs no body read, no parsing and no model work, and
every route under a protected prefix is covered without each one remembering a dependency. Probes
(``/health``, ``/ready``) and ``/metrics`` stay open for orchestrators and scrapers. Keys are compared
in constant time and never logged.

Keys may be grouped into tenants (``TENANT:KEY`` entries; a key without one is a tenant of its own).
With caches scoped per tenant (``--cache-scope tenant``), the matched key's tenant becomes the request's
cache scope (``RequestContext.cache_scope``): a digest, so that neither a tenant's name nor a key reaches
the shared store's keys.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping, Sequence

import blake3
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from mmencode.app.engine.errors import InvalidRequest
from mmencode.app.http.context import context_of
from mmencode.app.http.errors import error_response
from mmencode.app.metrics import Metrics

__all__ = ["PROTECTED_PATHS", "ApiKeyMiddleware", "InvalidApiKey", "is_protected", "tenant_scope"]


class InvalidApiKey(InvalidRequest):
    """401 with OpenAI's code, so OpenAI clients raise their ``AuthenticationError``."""

    status = 401
    code = "invalid_api_key"


# What a key guards. An entry ending in "/" guards every path under it; any other entry is one exact
# path (e.g. a peer protocol's "/encode"). Add routes here when they are added to the app.
PROTECTED_PATHS: tuple[str, ...] = ("/v1/",)


def is_protected(path: str, protected: Sequence[str] = PROTECTED_PATHS) -> bool:
    return any(path.startswith(entry) if entry.endswith("/") else path == entry for entry in protected)


def tenant_scope(tenant: str | None, key: str) -> str:
    """The cache scope of a key: its tenant's (the same for every key of a named tenant), or the key's own."""
    label = f"tenant\0{tenant}" if tenant is not None else f"key\0{key}"
    return blake3.blake3(label.encode()).hexdigest(length=16)


class ApiKeyMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        keys: Mapping[str, str | None] | Sequence[str],
        metrics: Metrics,
        protected: Sequence[str] = PROTECTED_PATHS,
        *,
        scope_by_tenant: bool = False,
    ) -> None:
        """``keys``: each key and its tenant (None: the key is a tenant of its own), or keys alone.
        ``scope_by_tenant``: record the key's tenant as the request's cache scope."""
        if not keys:
            raise ValueError("ApiKeyMiddleware needs at least one key")
        tenants = keys if isinstance(keys, Mapping) else dict.fromkeys(keys)
        self.app = app
        self._keys = [(key.encode(), tenant_scope(tenant, key)) for key, tenant in tenants.items()]
        self.metrics = metrics
        self.protected = tuple(protected)
        self.scope_by_tenant = scope_by_tenant

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_protected(scope["path"], self.protected):
            await self.app(scope, receive, send)
            return
        cache_scope = self._match(Headers(scope=scope).get("authorization"))
        if isinstance(cache_scope, InvalidApiKey):
            await error_response(cache_scope, context_of(scope), self.metrics)(scope, receive, send)
            return
        if self.scope_by_tenant:
            context_of(scope).cache_scope = cache_scope
        await self.app(scope, receive, send)

    def _match(self, authorization: str | None) -> str | InvalidApiKey:
        """The matched key's cache scope, or the refusal."""
        scheme, _, token = (authorization or "").strip().partition(" ")
        if not authorization or scheme.lower() != "bearer" or not token.strip():
            return _invalid("this service requires an API key: send the header `Authorization: Bearer <key>`")
        candidate = token.strip().encode()
        # Every key is compared, each in constant time: neither the timing nor the count of
        # comparisons tells how much of a guess was right or which key it was close to.
        matched: str | None = None
        for key, cache_scope in self._keys:
            if hmac.compare_digest(candidate, key):
                matched = cache_scope
        return matched if matched is not None else _invalid("the API key is not valid")


def _invalid(message: str) -> InvalidApiKey:
    return InvalidApiKey(message, param="Authorization", headers={"WWW-Authenticate": "Bearer"})
