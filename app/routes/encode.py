"""``POST /v1/encode``: JSON for programs, ``multipart/form-data`` with ``image`` files for curl."""

from __future__ import annotations

from typing import Any, Literal, get_args, get_origin

from fastapi import APIRouter, Request
from pydantic import ValidationError
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.responses import Response

from mmencode.app.deps import RuntimeDep
from mmencode.app.errors import PayloadTooLarge, ServiceError, validation_error
from mmencode.app.openapi import ERROR_RESPONSES, request_body
from mmencode.app.responses import JSONBytesResponse
from mmencode.app.scheduler import ItemInput, ItemResult
from mmencode.app.wire.encodings import embedding_payload
from mmencode.schemas.encode import EncodeOptions, EncodeRequest, EncodeResponse

router = APIRouter(tags=["encode"])

_MULTIPART_FIELDS = {"model", "precomputed", "encoding_format", "dtype", "pooling"}


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


@router.post(
    "/v1/encode",
    response_model=EncodeResponse,
    responses=ERROR_RESPONSES,
    summary="Encode images into embedding rows",
    openapi_extra=request_body(
        EncodeRequest,
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
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        options, items = await _read_multipart(request, runtime.settings.max_items_per_request)
    else:
        # Anything else is read as JSON: `curl -d` sends a form content type by default.
        body = _parse(EncodeRequest, await request.body())
        options = body
        items = [
            ItemInput(image=i.image, embedding=i.precomputed_embedding, metadata=i.metadata, hash=i.hash)
            for i in body.items
        ]
    runtime.check_model(options.model)
    results = await runtime.scheduler.encode(items, options.precomputed)
    request.state.items = len(results)
    request.state.tokens = sum(r.num_tokens for r in results)
    answer = _response(request.state.request_id, runtime.model_name, options, results)
    if runtime.ec_cache_writer is not None:
        # vLLM checks for the file as soon as the language request arrives: write before answering.
        paths = await runtime.ec_cache_writer.write_all([(r.hash, r.rows) for r in results])
        for item, path in zip(answer["items"], paths, strict=True):
            item["ec_cache_path"] = None if path is None else str(path)
    return JSONBytesResponse(answer)


def _parse(model: type[EncodeRequest], raw: bytes) -> EncodeRequest:
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise validation_error(exc.errors(include_url=False)) from None


async def _read_multipart(request: Request, max_items: int) -> tuple[EncodeOptions, list[ItemInput]]:
    try:
        form = await request.form(max_files=max_items, max_fields=len(_MULTIPART_FIELDS))
    except HTTPException as exc:
        # Starlette answers a malformed or oversized form with a bare 400; say it in the contract's terms.
        if isinstance(exc.__cause__, ServiceError) or exc.status_code != 400:
            raise
        if str(exc.detail).startswith("Too many files"):
            raise PayloadTooLarge(
                f"more than {max_items} `image` files, over the limit per request",
                param="image",
                details={"limit": "max_items_per_request", "max_items": max_items},
            ) from None
        raise validation_error([{"loc": ["body"], "msg": str(exc.detail), "type": "multipart"}]) from None
    uploads = [value for key, value in form.multi_items() if key == "image"]
    unknown = sorted({key for key in form if key != "image"} - _MULTIPART_FIELDS)
    problems: list[dict[str, Any]] = [
        {"loc": [key], "msg": "unknown form field", "type": "extra_forbidden"} for key in unknown
    ]
    if not uploads:
        problems.append({"loc": ["image"], "msg": "at least one `image` file is required", "type": "missing"})
    if any(not isinstance(upload, UploadFile) for upload in uploads):
        problems.append({"loc": ["image"], "msg": "`image` must be a file (curl -F image=@file)", "type": "file"})
    if problems:
        raise validation_error(problems)
    try:
        options = EncodeOptions.model_validate({k: v for k, v in form.items() if k in _MULTIPART_FIELDS})
    except ValidationError as exc:
        raise validation_error(exc.errors(include_url=False)) from None
    items = [ItemInput(image=await upload.read()) for upload in uploads if isinstance(upload, UploadFile)]
    await form.close()
    return options, items


def _response(request_id: str, model: str, options: EncodeOptions, results: list[ItemResult]) -> dict[str, Any]:
    items = []
    for result in results:
        rows = result.rows.mean(dim=0, keepdim=True) if options.pooling == "mean" else result.rows
        items.append(
            {
                "index": result.index,
                "source": result.source,
                "hash": result.hash,
                "num_tokens": result.num_tokens,
                "metadata": result.metadata,
                "embedding": embedding_payload(rows, encoding_format=options.encoding_format, dtype=options.dtype),
            }
        )
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
