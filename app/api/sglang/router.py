"""SGLang's encoder-server routes (sglang 0.5.23): ``POST /encode`` and ``POST /scheduler_receive_url``.

Answers are SGLang's: ``null`` on success (the embedding travels over ZMQ), and on failure a non-200
``{"status": "error", "message", "req_id"}`` that its language server reads, with mmencode's own error
object beside it under ``error``. Not in mmencode's OpenAPI document: the shapes are SGLang's, pinned
to one release (see ``schemas/sglang.py``). The work is :class:`app.peers.sglang.bridge.SGLangEncoderBridge`'s.
"""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ValidationError
from starlette.responses import Response

from mmencode.app.api.deps import MetricsDep, SGLangBridgeDep
from mmencode.app.engine.errors import ServiceError
from mmencode.app.http.cancellation import cancel_on_disconnect
from mmencode.app.http.context import context_of
from mmencode.app.http.errors import error_object, locate_errors_as
from mmencode.app.http.json_body import JiterRoute
from mmencode.app.http.responses import JSONBytesResponse
from mmencode.app.http.validation import validation_error
from mmencode.app.metrics import Metrics
from mmencode.app.peers.sglang.protocol import SGLANG_LOCATOR
from mmencode.schemas.sglang import SGLANG_VERSION, SGLangEncodeRequest, SGLangReceiveUrlRequest

router = APIRouter(
    tags=["sglang"],
    include_in_schema=False,
    route_class=JiterRoute,
    dependencies=[Depends(locate_errors_as(SGLANG_LOCATOR))],
)

M = TypeVar("M", bound=BaseModel)


@router.post("/encode")
async def encode(request: Request, bridge: SGLangBridgeDep, metrics: MetricsDep) -> Response:
    raw = await request.body()
    try:
        body = _parse(SGLangEncodeRequest, raw)
        results = await cancel_on_disconnect(request, bridge.encode(body), metrics)
    except ServiceError as error:
        return _error(request, metrics, error, _req_id_of(raw))
    context = context_of(request)
    context.items = len(results)
    context.tokens = sum(r.num_tokens for r in results)
    return JSONBytesResponse(None)


@router.post("/scheduler_receive_url")
async def scheduler_receive_url(request: Request, bridge: SGLangBridgeDep, metrics: MetricsDep) -> Response:
    raw = await request.body()
    try:
        bridge.register(_parse(SGLangReceiveUrlRequest, raw))
    except ServiceError as error:
        return _error(request, metrics, error, _req_id_of(raw))
    return JSONBytesResponse(None)


def _parse(model: type[M], raw: bytes) -> M:
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        subject = f"an SGLang {SGLANG_VERSION} {model.__name__.removeprefix('SGLang')}"
        raise validation_error(exc.errors(include_url=False), subject=subject) from None


def _req_id_of(raw: bytes) -> Any:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return body.get("req_id") if isinstance(body, dict) else None


def _error(request: Request, metrics: Metrics, error: ServiceError, req_id: Any) -> Response:
    """SGLang's failure answer, with mmencode's error object (items named as SGLang names them) beside it."""
    metrics.errors.labels(error.code).inc()
    context = context_of(request)
    context.error_code = error.code
    located = error_object(error, context.request_id, context.locator)
    body = {
        "status": "error",
        "message": f"{error.code}: {located['message']}",
        "req_id": req_id if isinstance(req_id, str) else None,
        "error": located,
    }
    return JSONBytesResponse(body, status_code=error.status, headers=error.headers)
