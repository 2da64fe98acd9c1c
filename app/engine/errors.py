"""The service's error tree, and the one place errors become HTTP responses.

Every layer raises a :class:`ServiceError` subclass (a stable ``code``, an HTTP status, a message with
the numbers, ``details``); the handlers here render all of them, FastAPI's validation errors and
anything unexpected, in the single error shape of ``schemas.errors``. Tracebacks go to the log only.

An error about one item of a request carries an :class:`ItemLocation` (the item's index and the field,
as data); each front end names items its own way (``items[2].image``, ``input[2]``, SGLang's
``mm_items[2].url``) through its :class:`ErrorLocator`, applied once, when the error is rendered.
"""

from __future__ import annotations

import logging
import typing
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from mmencode.app.http.responses import dumps_json
from mmencode.app.metrics import Metrics
from mmencode.app.suggest import did_you_mean
from mmencode.schemas.errors import ErrorType

logger = logging.getLogger("mmencode.errors")

# Probes and scrapes: answered every few seconds, logged at debug level (app/http/middleware.py too).
PROBE_PATHS = frozenset({"/health", "/ready", "/metrics"})


@dataclass(frozen=True, slots=True)
class ItemLocation:
    """Which item of a request an error is about, and which of its fields (the scheduler's names);
    ``index`` None: the items as a whole (too many of them, say)."""

    index: int | None
    field: tuple[str | int, ...] = ("image",)
    # The message and details already speak of the item (or of several): front ends add nothing.
    named_in_message: bool = False


@dataclass(frozen=True, slots=True)
class ErrorLocator:
    """How one front end names an item and its fields, in ``param`` and at the head of the message."""

    collection: str  # "items", "input", "mm_items"
    label: str  # the message's prefix: "item {index}", "input[{index}]"
    # The scheduler's field names in this API: renamed, or None where the item itself is the field.
    fields: Mapping[str, str | None] = field(default_factory=dict)

    def param(self, location: ItemLocation) -> str:
        if location.index is None:
            return self.collection
        path = f"{self.collection}[{location.index}]"
        head, *rest = location.field
        name = self.fields.get(str(head), str(head))
        if name is None:
            return path
        for part in (name, *rest):
            path += f"[{part}]" if isinstance(part, int) else f".{part}"
        return path

    def message(self, error: ServiceError) -> str:
        location = error.location
        if location is None or location.index is None or location.named_in_message:
            return error.message
        return f"{self.label.format(index=location.index)}: {error.message}"


# /v1/encode's names, and the default for errors raised outside any front end's route.
ENCODE_LOCATOR = ErrorLocator("items", "item {index}")


class ServiceError(Exception):
    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal_error"
    type: ClassVar[ErrorType] = "server_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        location: ItemLocation | None = None,
        details: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        # A request-level field (``dimensions``, ``model``); item fields go in ``location``.
        self.param = param
        self.location = location
        self.details = dict(details) if details is not None else None
        self.headers = dict(headers or {})

    def at_item(self, index: int, field: tuple[str | int, ...] = ("image",)) -> Self:
        """Attach where the error happened, as the layer that knows the item does; a location set by
        the layer that raised (which knew the field better) is kept."""
        if self.location is None and self.param is None:
            self.location = ItemLocation(index, field)
        return self


class InvalidRequest(ServiceError):
    status = 400
    code = "bad_request"
    type = "invalid_request_error"


class ValidationFailed(InvalidRequest):
    status = 422
    code = "validation_error"


class PartialPrecomputed(InvalidRequest):
    code = "partial_precomputed"


class MissingMetadata(InvalidRequest):
    code = "missing_metadata"


class PrecomputedShapeMismatch(InvalidRequest):
    code = "precomputed_shape_mismatch"


class InvalidImage(InvalidRequest):
    code = "invalid_image"


class InvalidVideo(InvalidRequest):
    """Not a video FFmpeg decodes, truncated, without frames, or refused by the model's video processor."""

    code = "invalid_video"


class InvalidAudio(InvalidRequest):
    """Not audio FFmpeg decodes, truncated, silent of samples, or in a layout the service does not take."""

    code = "invalid_audio"


class UnsupportedModality(InvalidRequest):
    """A video (or audio) item for a model that takes images only, or a server without the decoder."""

    code = "unsupported_modality"


class ImageFetchFailed(InvalidRequest):
    code = "image_fetch_failed"


class UrlNotAllowed(InvalidRequest):
    code = "url_not_allowed"


class UnknownHash(InvalidRequest):
    code = "unknown_hash"


class InvalidApiKey(InvalidRequest):
    """401 with OpenAI's code, so OpenAI clients raise their ``AuthenticationError``."""

    status = 401
    code = "invalid_api_key"


class ModelNotFound(InvalidRequest):
    status = 404
    code = "model_not_found"


class PayloadTooLarge(InvalidRequest):
    status = 413
    code = "payload_too_large"


class UnsupportedParameter(InvalidRequest):
    code = "unsupported_parameter"


class RouteNotFound(InvalidRequest):
    status = 404
    code = "not_found"


class MethodNotAllowed(InvalidRequest):
    status = 405
    code = "method_not_allowed"


class TokenCountMismatch(ServiceError):
    code = "token_count_mismatch"


class Overloaded(ServiceError):
    status = 503
    code = "overloaded"
    type = "overloaded_error"


class NotReady(ServiceError):
    status = 503
    code = "not_ready"


class RequestTimeout(ServiceError):
    status = 504
    code = "timeout"


class InternalError(ServiceError):
    pass


# --- the front door's upstreams (app/frontdoor) ---


class UpstreamUnavailable(ServiceError):
    """No healthy upstream serves the request's model now (all down, or all left the rotation)."""

    status = 503
    code = "upstream_unavailable"


class UpstreamFailed(ServiceError):
    """Every upstream tried failed before answering (connection refused or reset, closed mid-answer)."""

    status = 502
    code = "upstream_failed"


class UpstreamTimeout(ServiceError):
    status = 504
    code = "upstream_timeout"


class UpstreamRefused(ServiceError):
    """The upstream answered an error: its status and message reach the client as they were."""

    code = "upstream_error"

    def __init__(self, status: int, message: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.status = status  # type: ignore[misc]  # the upstream's, not the class's
        if status < 500:
            self.type = "invalid_request_error"  # type: ignore[misc]


class EncoderCacheWriteFailed(ServiceError):
    """A connector file could not be written: sending the request would make vLLM look for it (and die)."""

    status = 503
    code = "ec_write_failed"


def request_id_of(request: Request) -> str | None:
    return getattr(request.state, "request_id", None)


def locate_errors_as(locator: ErrorLocator) -> Any:
    """A router dependency: errors of this router's requests name items as ``locator`` does."""

    async def locate(request: Request) -> None:
        request.state.error_locator = locator

    return locate


def _render(request: Request, error: ServiceError) -> Response:
    state = request.scope.setdefault("state", {})
    locator = getattr(request.state, "error_locator", ENCODE_LOCATOR)
    metrics = getattr(request.app.state, "metrics", None)
    return error_response(error, request_id_of(request), metrics, state=state, locator=locator)


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


def error_response(
    error: ServiceError,
    request_id: str | None,
    metrics: Metrics | None = None,
    *,
    state: MutableMapping[str, Any] | None = None,
    locator: ErrorLocator = ENCODE_LOCATOR,
) -> Response:
    """The error as a response. ``state`` (the ASGI scope's) records the code for the access line."""
    if metrics is not None:
        metrics.errors.labels(error.code).inc()
    if state is not None:
        state["error_code"] = error.code
    return Response(
        content=dumps_json({"error": error_object(error, request_id, locator)}),
        status_code=error.status,
        media_type="application/json",
        headers=error.headers,
    )


def validation_error(
    problems: Sequence[Mapping[str, Any]],
    *,
    prefix: Sequence[str | int] = (),
    model: type[BaseModel] | None = None,
    subject: str | None = None,
) -> ValidationFailed:
    """A 422 listing every problem with its location, as pydantic reports them.

    With the body's ``model``, a misspelt field (``extra_forbidden``) says which field it likely meant;
    ``subject`` (``"an SGLang 0.5.23 EncodeRequest"``) says what the body failed to be.
    """
    listed = [
        {
            "loc": [*prefix, *problem.get("loc", ())],
            "msg": str(problem.get("msg", "")) + _suggestion(problem, model),
            "type": str(problem.get("type", "")),
        }
        for problem in problems
    ]
    first = listed[0] if listed else {"loc": [], "msg": "invalid request"}
    where = _param(first["loc"])
    summary = f"{len(listed)} problem(s) in the request; first: {where or 'body'}: {first['msg']}"
    return ValidationFailed(
        f"not {subject}: {summary}" if subject else summary,
        param=where,
        details={"errors": listed},
    )


def _suggestion(problem: Mapping[str, Any], model: type[BaseModel] | None) -> str:
    """``"; did you mean `image`?"`` for an unknown field close to one its object has; else ``""``."""
    loc = [part for part in problem.get("loc", ()) if part != "body"]
    if model is None or problem.get("type") != "extra_forbidden" or not loc or not isinstance(loc[-1], str):
        return ""
    fields = _fields_at(model, loc[:-1])
    meant = did_you_mean(loc[-1], fields) if fields else None
    return f"; did you mean `{meant}`?" if meant else ""


def _fields_at(model: type[BaseModel], loc: Sequence[Any]) -> list[str] | None:
    """The field names of the object at ``loc`` inside ``model`` (list indices pass through)."""
    current: type[BaseModel] | None = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = current.model_fields.get(str(part)) if current is not None else None
        current = _model_in(field.annotation) if field is not None else None
        if current is None:
            return None
    return list(current.model_fields) if current is not None else None


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside ``X``, ``X | None``, ``list[X]``, ``Annotated[X, ...]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in typing.get_args(annotation):
        found = _model_in(argument)
        if found is not None:
            return found
    return None


def _param(loc: Sequence[Any]) -> str | None:
    # ("body", "items", 1, "image") -> "items[1].image"
    out = ""
    for part in loc:
        if part in ("body", "query", "path", "header") and not out:
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None


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
