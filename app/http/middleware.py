"""Per-request context: the request id, the access-log line, and the last line of defence.

A pure ASGI middleware (no BaseHTTPMiddleware: it would buffer streaming bodies and break
cancellation). It sits outside the routes, so it also turns an exception that escaped every handler
into ``internal_error`` in the one error shape, with the id that the log line carries.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Iterable, Iterator

from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import ClientDisconnect
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mmencode.app.engine.errors import InternalError
from mmencode.app.http.context import context_of
from mmencode.app.http.errors import PROBE_PATHS, error_response
from mmencode.app.metrics import Metrics

__all__ = ["RequestContextMiddleware"]

access_log = logging.getLogger("mmencode.access")
error_log = logging.getLogger("mmencode.errors")

# A client-sent id is echoed only if it is short and printable, so it cannot forge log lines.
_SAFE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
# Probes and scrapes are not load: they stay out of the in-flight gauge that autoscalers read.
_NOT_LOAD = PROBE_PATHS


class RequestContextMiddleware:
    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        sent = Headers(scope=scope).get("x-request-id", "")
        request_id = sent if _SAFE_REQUEST_ID.fullmatch(sent) else uuid.uuid4().hex
        context = context_of(scope)
        context.request_id = request_id
        started = time.perf_counter()
        is_load = scope.get("path") not in _NOT_LOAD
        if is_load:
            self.metrics.requests_in_flight.inc()
        status = 500
        response_started = False

        async def send_with_id(message: Message) -> None:
            nonlocal status, response_started
            if message["type"] == "http.response.start":
                response_started = True
                status = message["status"]
                MutableHeaders(scope=message)["x-request-id"] = request_id
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except ClientDisconnect:
            # The client went away mid-body: nobody to answer, nothing went wrong on our side.
            status = 499
        except Exception:
            error_log.exception("unhandled error in request %s", request_id)
            if response_started:
                raise
            error = InternalError(f"internal error; see the server log for request {request_id}")
            response = error_response(error, context, self.metrics)
            await response(scope, receive, send_with_id)
        finally:
            if is_load:
                self.metrics.requests_in_flight.dec()
            elapsed = time.perf_counter() - started
            route = _route_template(scope)
            method = scope.get("method", "-")
            self.metrics.requests.labels(route, method, str(status)).inc()
            self.metrics.request_seconds.labels(route, method, str(status)).observe(elapsed)
            # A refused request names its error code; never a header (keys) or a body.
            code = context.error_code
            # Probes and scrapes come every few seconds: at debug level, unless one fails unexpectedly
            # (a 503 while loading or draining is expected; the phase changes are logged by the runtime).
            quiet = not is_load and (status < 500 or code == "not_ready")
            access_log.log(
                logging.DEBUG if quiet else logging.INFO,
                "%s %s %s %s %d items=%s tokens=%s %.1fms%s%s",
                request_id,
                _client(scope),
                method,
                scope.get("path", "-"),
                status,
                "-" if context.items is None else context.items,
                "-" if context.tokens is None else context.tokens,
                elapsed * 1000,
                f" code={code}" if code else "",
                # The chat front door's upstream(s) asked, so a slow or failed answer names its server.
                f" upstream={context.upstream}" if context.upstream else "",
            )


def _client(scope: Scope) -> str:
    """host:port of the peer (behind a trusted proxy, uvicorn has already put the forwarded address here)."""
    client = scope.get("client")
    if not client:
        return "-"
    host, port = client
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


def _route_template(scope: Scope) -> str:
    """The route's path template, not the raw path: label values must stay few.

    FastAPI's API routes put themselves in the scope; the routes it adds itself (``/docs``,
    ``/openapi.json``) and mounts (static files) do not, so those are matched here, once, after the fact.
    """
    route = scope.get("route")
    if route is not None:
        return str(getattr(route, "path", "unmatched"))
    app = scope.get("app")
    for candidate in _leaf_routes(getattr(app, "routes", ())):
        if candidate.matches(dict(scope))[0] is Match.FULL:
            return str(getattr(candidate, "path", "unmatched"))
    return "unmatched"


def _leaf_routes(routes: Iterable[BaseRoute]) -> Iterator[BaseRoute]:
    """The app's routes with included routers opened (FastAPI keeps an included APIRouter as one route that
    dispatches to its own): a request refused before routing, a 413 on its Content-Length, is counted
    under the route it was for."""
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            yield from _leaf_routes(included.routes)
        elif isinstance(route, BaseRoute):
            yield route
