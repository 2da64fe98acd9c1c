"""A ``/v1/encode`` request as ``(options, items)``: from its JSON body, or from ``multipart/form-data``.

Multipart comes in two forms. ``image`` file parts plus optional text fields (``model``,
``encoding_format``, ...): one item per file. Or a ``request`` part holding the JSON body, whose items
may take their image, video, audio or precomputed embedding from file parts named
``items[<index>].image``, ``items[<index>].video``, ``items[<index>].audio`` and
``items[<index>].precomputed_embedding`` (raw little-endian bytes; dtype
and shape in the JSON): the part's bytes go where the JSON would carry text, and the request is
validated as a JSON one.
"""

from __future__ import annotations

import re
from typing import Any

import orjson
from pydantic import ValidationError
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request

from mmencode.app.engine.errors import PayloadTooLarge, ServiceError
from mmencode.app.engine.types import AudioItem, ImageItem, Item, Precomputed, VideoItem
from mmencode.app.http.validation import validation_error
from mmencode.app.media.sniff import sniff
from mmencode.app.suggest import did_you_mean
from mmencode.schemas.encode import EncodeItem, EncodeOptions, EncodeRequest, PrecomputedEmbedding

__all__ = ["MULTIPART_FIELDS", "parse_json", "read_multipart"]

MULTIPART_FIELDS = {"model", "precomputed", "encoding_format", "dtype", "pooling"}
_ITEM_PART = re.compile(r"items\[(0|[1-9][0-9]{0,8})\]\.(image|video|audio|precomputed_embedding)")
_TWICE = "given both in `request` and as a file part"


def parse_json(raw: bytes) -> tuple[EncodeOptions, list[Item]]:
    """A JSON body (anything but multipart is read as JSON: `curl -d` sends a form content type)."""
    body = _parse(raw)
    return body, _items(body)


def _did_you_mean(field: str) -> str:
    if field in ("video", "audio"):
        # Only images go as bare file parts; a clip goes in an item, beside a `request` that says what it is.
        return (
            f"; a {field} file goes in an item: -F 'request={{\"items\": [{{}}]}}' -F 'items[0].{field}=@file' "
            f'(or as a data URI in JSON: {{"items": [{{"{field}": "data:..."}}]}})'
        )
    meant = did_you_mean(field, ["image", *MULTIPART_FIELDS])
    return f"; did you mean `{meant}`?" if meant else ""


def _parse(raw: bytes | dict[str, Any]) -> EncodeRequest:
    try:
        if isinstance(raw, dict):
            return EncodeRequest.model_validate(raw)
        return EncodeRequest.model_validate_json(raw)
    except ValidationError as exc:
        looks = sniff(raw) if isinstance(raw, bytes) else None
        if looks is not None:
            # A file sent as the body itself (curl --data-binary @cat.jpg): say what it is and how files go.
            what, field = looks
            how = (
                "-F image=@file"
                if field == "image"
                else f"-F 'request={{\"items\": [{{}}]}}' -F 'items[0].{field}=@file'"
            )
            message = f"the body is {what}, not a JSON request: send files as multipart ({how})"
            raise validation_error([{"loc": ["body"], "msg": message, "type": "json_invalid"}]) from None
        raise validation_error(exc.errors(include_url=False), model=EncodeRequest) from None


def _items(body: EncodeRequest) -> list[Item]:
    return [_item(item) for item in body.items]


def _item(item: EncodeItem) -> Item:
    """The engine's item for one wire item: its kind by the file it carries, else by ``modality`` (a
    precomputed item's, which says which metadata it needs), else an image."""
    embedding = _precomputed(item.precomputed_embedding)
    common: dict[str, Any] = {"embedding": embedding, "metadata": item.metadata, "hash": item.hash}
    kind = "video" if item.video is not None else "audio" if item.audio is not None else None
    kind = kind or ("image" if item.image is not None else item.modality or "image")
    if kind == "video":
        if isinstance(item.video, list):
            # A frame list is taken whole; its fps is the rate the frames were sampled at.
            return VideoItem(file=item.video, frames_fps=item.fps, **common)
        return VideoItem(file=item.video, fps=item.fps, num_frames=item.num_frames, rule=item.sampling, **common)
    if kind == "audio":
        return AudioItem(file=item.audio, **common)
    return ImageItem(file=item.image, **common)


def _precomputed(embedding: PrecomputedEmbedding | None) -> Precomputed | None:
    if embedding is None:
        return None
    rows, width = embedding.shape
    return Precomputed(data=embedding.data, dtype=embedding.dtype, shape=(rows, width))


async def read_multipart(request: Request, max_items: int, max_body: int) -> tuple[EncodeOptions, list[Item]]:
    # Up to two file parts per item (image and embedding); text parts may be as large as the body
    # (a `request` with inline base64), which the body limit already bounds.
    max_files = 2 * max_items
    try:
        form = await request.form(max_files=max_files, max_fields=len(MULTIPART_FIELDS) + 1, max_part_size=max_body)
    except HTTPException as exc:
        # Starlette answers a malformed or oversized form with a bare 400; say it in the contract's terms.
        if isinstance(exc.__cause__, ServiceError) or exc.status_code != 400:
            raise
        if str(exc.detail).startswith("Too many files"):
            raise PayloadTooLarge(
                f"more than {max_files} file parts, over the limit of {max_items} items per request "
                "(--max-items-per-request)",
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


async def _image_parts(form: FormData, max_items: int) -> tuple[EncodeOptions, list[Item]]:
    """The curl form: ``image`` files and text options."""
    uploads = [value for key, value in form.multi_items() if key == "image"]
    unknown = sorted({key for key in form if key != "image"} - MULTIPART_FIELDS)
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
            f"more than {max_items} `image` files, over the limit per request (--max-items-per-request)",
            param="image",
            details={"limit": "max_items_per_request", "max_items": max_items},
        )
    try:
        options = EncodeOptions.model_validate({k: v for k, v in form.items() if k in MULTIPART_FIELDS})
    except ValidationError as exc:
        raise validation_error(exc.errors(include_url=False), model=EncodeOptions) from None
    items: list[Item] = [ImageItem(file=await upload.read()) for upload in uploads if isinstance(upload, UploadFile)]
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
        if field in ("image", "video", "audio"):
            if item.get(field) is not None:
                problems.append({"loc": where, "msg": _TWICE, "type": "multipart"})
            item[field] = data
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
