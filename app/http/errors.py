"""Errors as HTTP answers: the one place a :class:`ServiceError` becomes a response.

The handlers here render every error of the engine's tree (``app/engine/errors.py``), FastAPI's
validation errors and anything unexpected, in the single error shape of ``schemas.errors``.
Tracebacks go to the log only.

Each API names a request's items its own way (``items[2].image``, ``input[2]``, SGLang's
``mm_items[2].url``): its router declares an :class:`ErrorLocator` once (:func:`locate_errors_as`),
and the error's :class:`ItemLocation` is turned into that API's names when the error is rendered.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from mmencode.app.engine.errors import InternalError, InvalidRequest, NotReady, PayloadTooLarge, ServiceError
from mmencode.app.http.context import RequestContext, context_of
from mmencode.app.http.locators import ENCODE_LOCATOR, ErrorLocator
from mmencode.app.http.validation import validation_error
from mmencode.app.metrics import Metrics
from mmencode.app.wire.json import dumps_json

__all__ = [
    "PROBE_PATHS",
    "MethodNotAllowed",
    "RouteNotFound",
    "error_object",
    "error_response",
    "install_error_handlers",
    "locate_errors_as",
]

logger = logging.getLogger("mmencode.errors")

# Probes and scrapes: answered every few seconds, logged at debug level (app/http/middleware.py too).
PROBE_PATHS = frozenset({"/health", "/ready", "/metrics"})


class RouteNotFound(InvalidRequest):
    status = 404
    code = "not_found"


class MethodNotAllowed(InvalidRequest):
    status = 405
    code = "method_not_allowed"


def locate_errors_as(locator: ErrorLocator) -> Any:
    """A router's dependency: errors of its requests name items as ``locator`` does."""

    async def locate(request: Request) -> None:
        context_of(request).locator = locator

    return locate


def request_id_of(request: Request) -> str:
    return context_of(request).request_id


def _render(request: Request, error: ServiceError) -> Response:
    context = context_of(request)
    metrics = getattr(request.app.state, "metrics", None)
    return error_response(error, context, metrics)


def error_object(error: ServiceError, request_id: str | None, locator: ErrorLocator = ENCODE_LOCATOR) -> dict[str, Any]:
    """The ``error`` object of the one error shape, with the item named as ``locator`` names it."""
    location = error.location
    details = error.details
    if location is not None and location.index is not None and not location.named_in_message:
        details = {"index": location.index, **(details or {})}
    return {
        "message": locator.message(error),
        "type": error.type,
        "code": error.code,
        "param": locator.param(location) if location is not None else error.param,
        "details": details,
        "request_id": request_id,
    }


def error_response(error: ServiceError, context: RequestContext, metrics: Metrics | None = None) -> Response:
    """The error as a response, its items named by the request's locator; the code goes in the context
    for the access line."""
    if metrics is not None:
        metrics.errors.labels(error.code).inc()
    context.error_code = error.code
    return Response(
        content=dumps_json({"error": error_object(error, context.request_id, context.locator)}),
        status_code=error.status,
        media_type="application/json",
        headers=error.headers,
    )


async def _service_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServiceError)
    if exc.status == 500:
        logger.error("request %s failed: %s: %s", request_id_of(request), exc.code, exc.message)
    elif exc.status > 500:
        # A readiness probe's 503 is its answer, not an incident: the runtime logs each phase change once.
        probe = isinstance(exc, NotReady) and request.url.path in PROBE_PATHS
        logger.log(
            logging.DEBUG if probe else logging.WARNING,
            "request %s refused: %s: %s",
            request_id_of(request),
            exc.code,
            exc.message,
        )
    return _render(request, exc)


async def _request_validation(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    problems = [
        {"loc": err.get("loc", ()), "msg": err.get("msg", ""), "type": err.get("type", "")} for err in exc.errors()
    ]
    return _render(request, validation_error(problems))


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    error: ServiceError
    if isinstance(exc.__cause__, ServiceError):
        # FastAPI wraps errors raised while it reads a body (e.g. the body limit) in a plain 400.
        error = exc.__cause__
    elif exc.status_code == 400 and exc.__cause__ is not None:
        # ... and a body it cannot parse (not UTF-8, nested too deep): the schema's problem, 422.
        reason = str(exc.__cause__)[:200]
        problem = {"loc": ["body"], "msg": f"cannot parse the body: {reason}", "type": "json_invalid"}
        error = validation_error([problem])
    elif exc.status_code == 404:
        error = RouteNotFound(f"no route {request.method} {request.url.path}")
    elif exc.status_code == 405:
        error = MethodNotAllowed(f"{request.method} is not allowed on {request.url.path}")
    elif exc.status_code == 413:
        error = PayloadTooLarge(str(exc.detail))
    elif exc.status_code < 500:
        error = InvalidRequest(str(exc.detail))
    else:
        error = InternalError(str(exc.detail))
    error.headers.update(exc.headers or {})
    return _render(request, error)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(RequestValidationError, _request_validation)
    app.add_exception_handler(StarletteHTTPException, _http_exception)
