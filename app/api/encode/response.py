"""A ``/v1/encode`` answer as bytes: JSON, or a safetensors container with the JSON in its header.

Each item's rows are written once per variant (encoding format, dtype, pooling) and kept in the
response memo (:class:`app.engine.cache.ResponseMemo`); a later answer for the same rows splices the kept
payload in as it is: a JSON fragment, or the tensor a safetensors container carries.

The safetensors form holds one tensor per item, ``items.<index>`` (``[rows, width]`` in the requested
dtype, little-endian), and one header entry, ``__metadata__["response"]``: the JSON answer, in which each
``embedding.data`` is the name of the item's tensor instead of the values.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import orjson
import safetensors.torch
import torch

from mmencode.app.engine.cache import Payload
from mmencode.app.wire.encodings import binary_rows, data_json
from mmencode.app.wire.json import dumps_json

if TYPE_CHECKING:
    from mmencode.app.engine.types import ItemResult

__all__ = ["HEADER_KEY", "PayloadMemo", "render_encode_response", "tensor_name"]

HEADER_KEY = "response"


class PayloadMemo(Protocol):
    def payload(self, content_hash: str, rows: torch.Tensor, variant: Hashable) -> Payload | None: ...

    def keep_payload(self, content_hash: str, rows: torch.Tensor, variant: Hashable, payload: Payload) -> bool: ...


def tensor_name(index: int) -> str:
    return f"items.{index}"


def render_encode_response(
    answer: dict[str, Any],
    results: Sequence[ItemResult],
    *,
    encoding_format: str,
    dtype: str,
    pooling: str,
    memo: PayloadMemo | None,
) -> bytes:
    """``answer`` (every field but the items' ``embedding``) with each result's rows, as response bytes.

    Runs off the event loop for large answers: the memo is thread-safe.
    """
    variant = (encoding_format, dtype, pooling)
    payloads: list[Payload] = []
    for result in results:
        kept = memo.payload(result.hash, result.rows, variant) if memo is not None and result.hash else None
        if kept is None:
            kept = _payload(result.rows, encoding_format, dtype, pooling)
            if memo is not None and result.hash and kept is not result.rows:
                memo.keep_payload(result.hash, result.rows, variant, kept)
        payloads.append(kept)
    for item, result in zip(answer["items"], results, strict=True):
        rows = 1 if pooling == "mean" else int(result.rows.shape[0])
        item["embedding"] = {
            "encoding_format": encoding_format,
            "dtype": dtype,
            "shape": [rows, int(result.rows.shape[1])],
        }
    if encoding_format == "safetensors":
        return _safetensors(answer, payloads)
    return _json(answer, payloads)


def _payload(rows: torch.Tensor, encoding_format: str, dtype: str, pooling: str) -> Payload:
    pooled = rows.mean(dim=0, keepdim=True) if pooling == "mean" else rows
    if encoding_format == "safetensors":
        # Float32 rows unpooled are their own payload: nothing to keep beside them.
        return binary_rows(pooled, dtype)
    return data_json(pooled, encoding_format=encoding_format, dtype=dtype)


def _json(answer: dict[str, Any], payloads: list[Payload]) -> bytes:
    for item, payload in zip(answer["items"], payloads, strict=True):
        assert isinstance(payload, bytes)
        item["embedding"]["data"] = orjson.Fragment(payload)
    try:
        return orjson.dumps(answer)
    except TypeError:
        # Echoed metadata orjson refuses (integers past 64 bits): the standard library's slower path.
        for item, payload in zip(answer["items"], payloads, strict=True):
            assert isinstance(payload, bytes)
            item["embedding"]["data"] = orjson.loads(payload)
        return dumps_json(answer)


def _safetensors(answer: dict[str, Any], payloads: list[Payload]) -> bytes:
    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for item, payload in zip(answer["items"], payloads, strict=True):
        assert isinstance(payload, torch.Tensor)
        name = tensor_name(item["index"])
        item["embedding"]["data"] = name
        if payload.data_ptr() in seen:
            # The same content twice in one request shares one tensor; safetensors refuses to
            # write overlapping memory twice, so the repeat gets its own copy.
            payload = payload.clone()
        seen.add(payload.data_ptr())
        tensors[name] = payload
    header = dumps_json(answer).decode()
    return safetensors.torch.save(tensors, metadata={HEADER_KEY: header})
