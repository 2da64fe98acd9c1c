"""``POST /v1/encode``: JSON for programs, ``multipart/form-data`` for curl and binary uploads.

Answers are JSON, or safetensors when the request's ``encoding_format`` or its ``Accept`` header asks
for it (:mod:`app.api.encode.negotiation`); errors are always JSON. The request forms are
:mod:`app.api.encode.request`'s; the work is :class:`app.api.EncodeService`'s.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from mmencode.app.api.deps import EncodeServiceDep, MetricsDep, SettingsDep
from mmencode.app.api.encode.negotiation import JSON_MEDIA_TYPE, SAFETENSORS_MEDIA_TYPE, negotiate
from mmencode.app.api.encode.openapi import ENCODE_DESCRIPTION, ENCODE_REQUEST_BODY, ENCODE_RESPONSES
from mmencode.app.api.encode.request import parse_json, read_multipart
from mmencode.app.http.cancellation import cancel_on_disconnect
from mmencode.app.http.context import context_of
from mmencode.app.http.errors import locate_errors_as
from mmencode.app.http.json_body import JiterRoute
from mmencode.app.http.locators import ENCODE_LOCATOR
from mmencode.schemas.encode import EncodeOptions, EncodeResponse

router = APIRouter(tags=["encode"], route_class=JiterRoute, dependencies=[Depends(locate_errors_as(ENCODE_LOCATOR))])


@router.post(
    "/v1/encode",
    response_model=EncodeResponse,
    responses=ENCODE_RESPONSES,
    summary="Encode images into embedding rows",
    description=ENCODE_DESCRIPTION,
    openapi_extra=ENCODE_REQUEST_BODY,
)
async def encode(request: Request, service: EncodeServiceDep, settings: SettingsDep, metrics: MetricsDep) -> Response:
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        options, items = await read_multipart(request, settings.max_items_per_request, settings.max_body_bytes)
    else:
        options, items = parse_json(await request.body())
    media_type = _answer_media_type(options, request.headers.get("accept"))
    context = context_of(request)
    binary = media_type != JSON_MEDIA_TYPE
    work = service.encode(options, items, binary=binary, request_id=context.request_id, scope=context.cache_scope)
    answer = await cancel_on_disconnect(request, work, metrics)
    context.items, context.tokens = answer.items, answer.tokens
    return Response(answer.body, media_type=media_type, headers={"Vary": "Accept"})


def _answer_media_type(options: EncodeOptions, accept: str | None) -> str:
    """An explicit ``encoding_format`` decides; without one, ``Accept`` chooses JSON or safetensors. A push
    answers JSON (its rows went to the consumer)."""
    if options.ec_transfer_params is not None:
        return JSON_MEDIA_TYPE
    if "encoding_format" in options.model_fields_set:
        return SAFETENSORS_MEDIA_TYPE if options.encoding_format == "safetensors" else JSON_MEDIA_TYPE
    return negotiate(accept)
