"""``/v1/encode``'s OpenAPI extras: the multipart form and the binary answers, which FastAPI cannot infer
from a route that reads its body by hand."""

from __future__ import annotations

from typing import Any, Literal, get_args, get_origin

from mmencode.app.api.encode.negotiation import BINARY_MEDIA_TYPES
from mmencode.app.api.encode.request import MULTIPART_FIELDS
from mmencode.app.http.openapi import ERROR_RESPONSES, request_body
from mmencode.schemas.encode import EncodeOptions, EncodeRequest

__all__ = ["ENCODE_DESCRIPTION", "ENCODE_REQUEST_BODY", "ENCODE_RESPONSES"]


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
ENCODE_DESCRIPTION = (
    "JSON, or `multipart/form-data` in one of two forms: `image` files with text options (below), or a "
    "`request` part holding the JSON body whose items may send `image` or `precomputed_embedding.data` as file "
    "parts `items[<index>].image` / `items[<index>].precomputed_embedding` (raw little-endian bytes of `dtype`, "
    "row-major `shape`).\n\nThe answer is JSON, or, with `encoding_format: safetensors` or an `Accept` header "
    "preferring it, a safetensors "
    "container, tensors `items.<index>` (`[rows, width]`, little-endian, in `dtype`), the JSON answer in "
    '`__metadata__["response"]` with each `embedding.data` naming its tensor.'
)


ENCODE_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES,
    200: {"content": {media_type: {"schema": _BINARY_SCHEMA} for media_type in BINARY_MEDIA_TYPES}},
}
ENCODE_REQUEST_BODY = request_body(
    EncodeRequest,
    # The curl form only: the `request` form's valid part names depend on its JSON, which a
    # schema cannot say; the operation's description and docs/api.md give it.
    multipart={
        "type": "object",
        "required": ["image"],
        "additionalProperties": False,
        "properties": {
            "image": {"type": "array", "items": {"type": "string", "format": "binary"}, "minItems": 1},
            **{name: _form_field_schema(name) for name in sorted(MULTIPART_FIELDS)},
        },
    },
)
