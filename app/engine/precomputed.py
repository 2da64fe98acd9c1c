"""Client-sent embeddings to tensors: decoding and the checks that need no model.

``data`` arrives as base64 text or nested numbers (JSON), or as the raw bytes of a multipart file part;
base64 and raw bytes meet the same byte-count, size and finiteness checks with the same errors.
"""

from __future__ import annotations

import binascii

import numpy as np
import torch

from mmencode.app.engine.errors import ItemLocation, PayloadTooLarge, PrecomputedShapeMismatch, ValidationFailed
from mmencode.app.engine.types import Precomputed
from mmencode.app.media.b64 import decode_lenient_padding

__all__ = ["decode_precomputed"]

_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def decode_precomputed(embedding: Precomputed, *, index: int, max_bytes: int) -> torch.Tensor:
    """Item ``index``'s rows as a float32 ``(rows, width)`` tensor; raises on bad encoding, size, or
    non-finite values, located at the item's ``precomputed_embedding``."""
    where = ItemLocation(index, ("precomputed_embedding",))
    data = ItemLocation(index, ("precomputed_embedding", "data"))
    rows, width = embedding.shape
    expected_bytes = rows * width * _ITEMSIZE[embedding.dtype]
    if expected_bytes > max_bytes:
        raise PayloadTooLarge(
            f"precomputed_embedding declares {expected_bytes} bytes, over the limit of {max_bytes} (--max-body-bytes)",
            location=where,
            details={"limit": "max_body_bytes", "max_bytes": max_bytes, "bytes": expected_bytes},
        )
    if isinstance(embedding.data, bytes):
        tensor = _from_bytes(embedding.data, embedding.dtype, rows, width, expected_bytes, data)
    elif isinstance(embedding.data, str):
        tensor = _from_bytes(_base64(embedding.data, data), embedding.dtype, rows, width, expected_bytes, data)
    else:
        lengths = {len(row) for row in embedding.data}
        if len(embedding.data) != rows or lengths != {width}:
            raise PrecomputedShapeMismatch(
                f"precomputed_embedding.data has {len(embedding.data)} rows of widths {sorted(lengths)}, "
                f"but shape says {[rows, width]}",
                location=data,
                details={"declared_shape": [rows, width], "rows": len(embedding.data), "widths": sorted(lengths)},
            )
        tensor = torch.tensor(embedding.data, dtype=torch.float32)
    finite = torch.isfinite(tensor)
    if not bool(finite.all()):
        # Said with the first place: 1e39 is a finite JSON number, but infinite as float32.
        row, column = (int(v) for v in (~finite).nonzero()[0])
        raise ValidationFailed(
            f"precomputed_embedding contains NaN or infinite values (as float32), first at row {row}, column {column}",
            location=data,
            details={"errors": [{"loc": [*_loc(data), row, column], "msg": "values must be finite", "type": "finite"}]},
        )
    return tensor


def _loc(location: ItemLocation) -> list[str | int]:
    """The pydantic-style ``loc`` of a field of /v1/encode's items (the only route taking embeddings)."""
    assert location.index is not None
    return ["items", location.index, *location.field]


def _base64(text: str, location: ItemLocation) -> bytes:
    try:
        return decode_lenient_padding(text)
    except (binascii.Error, ValueError) as exc:
        raise ValidationFailed(
            f"precomputed_embedding.data is not valid base64 ({exc})",
            location=location,
            details={"errors": [{"loc": _loc(location), "msg": "invalid base64", "type": "base64"}]},
        ) from None


def _from_bytes(
    raw: bytes, dtype: str, rows: int, width: int, expected_bytes: int, location: ItemLocation
) -> torch.Tensor:
    if len(raw) != expected_bytes:
        raise PrecomputedShapeMismatch(
            f"precomputed_embedding.data holds {len(raw)} bytes; shape {[rows, width]} of {dtype} needs "
            f"{expected_bytes}",
            location=location,
            details={
                "declared_shape": [rows, width],
                "dtype": dtype,
                "bytes": len(raw),
                "expected_bytes": expected_bytes,
            },
        )
    if dtype == "bfloat16":
        bits = np.frombuffer(raw, dtype="<i2").copy()
        return torch.from_numpy(bits).view(torch.bfloat16).float().reshape(rows, width)
    array = np.frombuffer(raw, dtype="<f4" if dtype == "float32" else "<f2")
    return torch.from_numpy(array.astype(np.float32)).reshape(rows, width)
