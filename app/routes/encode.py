"""``POST /v1/encode``: JSON for programs, ``multipart/form-data`` for curl and binary uploads.

Answers are JSON, or safetensors when the request's ``encoding_format`` or its ``Accept`` header asks
for it (:mod:`app.wire.negotiation`); errors are always JSON.

Multipart comes in two forms. ``image`` file parts plus optional text fields (``model``,
``encoding_format``, ...): one item per file. Or a ``request`` part holding the JSON body, whose items
may take their image or precomputed embedding from file parts named ``items[<index>].image`` and
``items[<index>].precomputed_embedding`` (raw little-endian bytes; dtype and shape in the JSON): the
part's bytes go where the JSON would carry text, and the request is validated as a JSON one.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any, Literal, get_args, get_origin

import orjson
from fastapi import APIRouter, Depends, Request
from pydantic import ValidationError
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException
from starlette.responses import Response

from mmencode.app.deps import RuntimeDep
from mmencode.app.errors import ENCODE_LOCATOR, PayloadTooLarge, ServiceError, locate_errors_as, validation_error
from mmencode.app.openapi import ERROR_RESPONSES, request_body
from mmencode.app.routes.json_body import JiterRoute
from mmencode.app.scheduler import ItemInput, ItemResult
from mmencode.app.suggest import did_you_mean
from mmencode.app.wire.encode_response import render_encode_response
from mmencode.app.wire.negotiation import BINARY_MEDIA_TYPES, JSON_MEDIA_TYPE, SAFETENSORS_MEDIA_TYPE, negotiate
from mmencode.schemas.encode import EncodeOptions, EncodeRequest, EncodeResponse

router = APIRouter(tags=["encode"], route_class=JiterRoute, dependencies=[Depends(locate_errors_as(ENCODE_LOCATOR))])

_MULTIPART_FIELDS = {"model", "precomputed", "encoding_format", "dtype", "pooling"}
_ITEM_PART = re.compile(r"items\[(0|[1-9][0-9]{0,8})\]\.(image|precomputed_embedding)")
_TWICE = "given both in `request` and as a file part"
# Answers whose rows are past this are written on a thread: a 40 MB base64 string must not stall the loop.
_OFFLOAD_BYTES = 1 << 20


def _form_field_schema(name: str) -> dict[str, Any]:
    """A multipart text field's schema, from the same pydantic field the JSON body uses."""
    field = EncodeOptions.model_fields[name]
    schema: dict[str, Any] = {"type": "string"}
    if get_origin(field.annotation) is Literal:
        schema["enum"] = list(get_args(field.annotation))
    if isinstance(field.default, str):
        schema["default"] = field.default
    if field.description:
        schema["description"] = field.description
    return schema


_BINARY_SCHEMA = {"type": "string", "format": "binary"}
_DESCRIPTION = (
    "JSON, or `multipart/form-data` in one of two forms: `image` files with text options (below), or a "
    "`request` part holding the JSON body whose items may send `image` or `precomputed_embedding.data` as file "
    "parts `items[<index>].image` / `items[<index>].precomputed_embedding` (raw little-endian bytes of `dtype`, "
    "row-major `shape`).\n\nThe answer is JSON, or, with `encoding_format: safetensors` or an `Accept` header "
    "preferring it, a safetensors "
    "container, tensors `items.<index>` (`[rows, width]`, little-endian, in `dtype`), the JSON answer in "
    '`__metadata__["response"]` with each `embedding.data` naming its tensor.'
)


@router.post(
    "/v1/encode",
    response_model=EncodeResponse,
    responses={
        **ERROR_RESPONSES,
        200: {"content": {media_type: {"schema": _BINARY_SCHEMA} for media_type in BINARY_MEDIA_TYPES}},
    },
    summary="Encode images into embedding rows",
    description=_DESCRIPTION,
    openapi_extra=request_body(
        EncodeRequest,
        # The curl form only: the `request` form's valid part names depend on its JSON, which a
        # schema cannot say; the operation's description and docs/api.md give it.
        multipart={
            "type": "object",
            "required": ["image"],
            "additionalProperties": False,
            "properties": {
                "image": {"type": "array", "items": {"type": "string", "format": "binary"}, "minItems": 1},
                **{name: _form_field_schema(name) for name in sorted(_MULTIPART_FIELDS)},
            },
        },
    ),
)
async def encode(request: Request, runtime: RuntimeDep) -> Response:
    limits = runtime.settings
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        options, items = await _read_multipart(request, limits.max_items_per_request, limits.max_body_bytes)
    else:
        # Anything else is read as JSON: `curl -d` sends a form content type by default.
        options = _parse(await request.body())
        items = _items(options)
    runtime.check_model(options.model)
    media_type = _answer_media_type(options, request.headers.get("accept"))
    encoding_format = "safetensors" if media_type != JSON_MEDIA_TYPE else options.encoding_format
    results = await runtime.scheduler.encode(items, options.precomputed)
    request.state.items = len(results)
    request.state.tokens = sum(r.num_tokens for r in results)
    answer = _answer(request.state.request_id, runtime.model_name, results)
    if runtime.ec_cache_writer is not None:
        # vLLM checks for the file as soon as the language request arrives: write before answering.
        paths = await runtime.ec_cache_writer.write_all([(r.hash, r.rows) for r in results])
        for item, path in zip(answer["items"], paths, strict=True):
            item["ec_cache_path"] = None if path is None else str(path)

    def render() -> bytes:
        return render_encode_response(
            answer,
            results,
            encoding_format=encoding_format,
            dtype=options.dtype,
            pooling=options.pooling,
            memo=runtime.cache,
        )

    large = sum(r.rows.numel() for r in results) * 4 > _OFFLOAD_BYTES
    body = await asyncio.to_thread(render) if large else render()
    return Response(body, media_type=media_type, headers={"Vary": "Accept"})


def _did_you_mean(field: str) -> str:
    meant = did_you_mean(field, ["image", *_MULTIPART_FIELDS])
    return f"; did you mean `{meant}`?" if meant else ""


def _answer_media_type(options: EncodeOptions, accept: str | None) -> str:
    """An explicit ``encoding_format`` decides; without one, ``Accept`` chooses JSON or safetensors."""
    if "encoding_format" in options.model_fields_set:
        return SAFETENSORS_MEDIA_TYPE if options.encoding_format == "safetensors" else JSON_MEDIA_TYPE
    return negotiate(accept)


def _parse(raw: bytes | dict[str, Any]) -> EncodeRequest:
    try:
        if isinstance(raw, dict):
            return EncodeRequest.model_validate(raw)
        return EncodeRequest.model_validate_json(raw)
    except ValidationError as exc:
        raise validation_error(exc.errors(include_url=False), model=EncodeRequest) from None


def _items(body: EncodeRequest) -> list[ItemInput]:
    return [
        ItemInput(image=i.image, embedding=i.precomputed_embedding, metadata=i.metadata, hash=i.hash)
        for i in body.items
    ]


async def _read_multipart(request: Request, max_items: int, max_body: int) -> tuple[EncodeOptions, list[ItemInput]]:
    # Up to two file parts per item (image and embedding); text parts may be as large as the body
    # (a `request` with inline base64), which the body limit already bounds.
    max_files = 2 * max_items
    try:
        form = await request.form(max_files=max_files, max_fields=len(_MULTIPART_FIELDS) + 1, max_part_size=max_body)
    except HTTPException as exc:
        # Starlette answers a malformed or oversized form with a bare 400; say it in the contract's terms.
        if isinstance(exc.__cause__, ServiceError) or exc.status_code != 400:
            raise
        if str(exc.detail).startswith("Too many files"):
            raise PayloadTooLarge(
                f"more than {max_files} file parts, over the limit of {max_items} items per request",
                param="image",
                details={"limit": "max_items_per_request", "max_items": max_items},
            ) from None
        raise validation_error([{"loc": ["body"], "msg": str(exc.detail), "type": "multipart"}]) from None
    try:
        if "request" in form:
            body = _parse(await _request_with_parts(form))
            return body, _items(body)
        return await _image_parts(form, max_items)
    finally:
        await form.close()


async def _image_parts(form: FormData, max_items: int) -> tuple[EncodeOptions, list[ItemInput]]:
    """The curl form: ``image`` files and text options."""
    uploads = [value for key, value in form.multi_items() if key == "image"]
    unknown = sorted({key for key in form if key != "image"} - _MULTIPART_FIELDS)
    problems: list[dict[str, Any]] = [
        {"loc": [key], "msg": "unknown form field" + _did_you_mean(key), "type": "extra_forbidden"} for key in unknown
    ]
    if not uploads:
        problems.append({"loc": ["image"], "msg": "at least one `image` file is required", "type": "missing"})
    if any(not isinstance(upload, UploadFile) for upload in uploads):
        problems.append({"loc": ["image"], "msg": "`image` must be a file (curl -F image=@file)", "type": "file"})
    if problems:
        raise validation_error(problems)
    if len(uploads) > max_items:
        raise PayloadTooLarge(
            f"more than {max_items} `image` files, over the limit per request",
            param="image",
            details={"limit": "max_items_per_request", "max_items": max_items},
        )
    try:
        options = EncodeOptions.model_validate({k: v for k, v in form.items() if k in _MULTIPART_FIELDS})
    except ValidationError as exc:
        raise validation_error(exc.errors(include_url=False), model=EncodeOptions) from None
    items = [ItemInput(image=await upload.read()) for upload in uploads if isinstance(upload, UploadFile)]
    return options, items


async def _request_with_parts(form: FormData) -> dict[str, Any]:
    """The ``request`` part's JSON with each item's file parts put in place, ready to validate."""
    raw = form["request"]
    if len(form.getlist("request")) > 1:
        raise validation_error([{"loc": ["request"], "msg": "`request` is given twice", "type": "multipart"}])
    text = await raw.read() if isinstance(raw, UploadFile) else raw
    try:
        body = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise validation_error([{"loc": ["request"], "msg": f"invalid JSON: {exc}", "type": "json_invalid"}]) from None
    if not isinstance(body, dict):
        raise validation_error([{"loc": ["request"], "msg": "must be a JSON object", "type": "model_type"}])
    items = body.get("items")
    problems: list[dict[str, Any]] = []
    seen: set[str] = set()
    for key, value in form.multi_items():
        if key == "request":
            continue
        match = _ITEM_PART.fullmatch(key)
        if match is None:
            problems.append({"loc": [key], "msg": "unknown form field (with `request`)", "type": "extra_forbidden"})
            continue
        index, field = int(match.group(1)), match.group(2)
        where = ["items", index, field]
        if key in seen:
            problems.append({"loc": where, "msg": f"`{key}` is given twice", "type": "multipart"})
            continue
        seen.add(key)
        if not isinstance(value, UploadFile):
            message = f"`{key}` must be a file part (curl -F '{key}=@file')"
            problems.append({"loc": where, "msg": message, "type": "file"})
            continue
        if not isinstance(items, list) or index >= len(items) or not isinstance(items[index], dict):
            problems.append({"loc": where, "msg": f"`request` has no item {index} for this part", "type": "multipart"})
            continue
        item = items[index]
        data = await value.read()
        if field == "image":
            if item.get("image") is not None:
                problems.append({"loc": where, "msg": _TWICE, "type": "multipart"})
            item["image"] = data
            continue
        embedding = item.setdefault("precomputed_embedding", {})
        if embedding is None:
            embedding = item["precomputed_embedding"] = {}
        if not isinstance(embedding, dict):
            continue  # validation names the wrong type
        if "data" in embedding:
            problems.append({"loc": [*where, "data"], "msg": _TWICE, "type": "multipart"})
        embedding["data"] = data
    if problems:
        raise validation_error(problems)
    return body


def _answer(request_id: str, model: str, results: list[ItemResult]) -> dict[str, Any]:
    """Every field of the answer but the items' ``embedding``, which the renderer writes."""
    items = [
        {
            "index": result.index,
            "source": result.source,
            "hash": result.hash,
            "num_tokens": result.num_tokens,
            "metadata": result.metadata,
        }
        for result in results
    ]
    return {
        "id": f"enc-{request_id}",
        "model": model,
        "items": items,
        "usage": {
            "items": len(results),
            "tokens": sum(r.num_tokens for r in results),
            "encoded_items": sum(r.source == "encoder" for r in results),
            "cached_items": sum(r.source == "cache" for r in results),
            "precomputed_items": sum(r.source == "precomputed" for r in results),
        },
    }
