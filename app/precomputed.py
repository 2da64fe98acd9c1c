"""Client-sent embeddings to tensors: decoding and the checks that need no model.

``data`` arrives as base64 text or nested numbers (JSON), or as the raw bytes of a multipart file part;
base64 and raw bytes meet the same byte-count, size and finiteness checks with the same errors.
"""

from __future__ import annotations

import binascii

import numpy as np
import torch

from mmencode.app.errors import PayloadTooLarge, PrecomputedShapeMismatch, ValidationFailed
from mmencode.app.wire.b64 import decode_lenient_padding
from mmencode.schemas.encode import PrecomputedEmbedding

__all__ = ["decode_precomputed"]

_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def decode_precomputed(embedding: PrecomputedEmbedding, *, param: str, max_bytes: int) -> torch.Tensor:
    """A float32 ``(rows, width)`` tensor; raises on bad encoding, size, or non-finite values."""
    rows, width = embedding.shape
    expected_bytes = rows * width * _ITEMSIZE[embedding.dtype]
    if expected_bytes > max_bytes:
        raise PayloadTooLarge(
            f"{param} declares {expected_bytes} bytes, over the limit of {max_bytes}",
            param=param,
            details={"limit": "max_body_bytes", "max_bytes": max_bytes, "bytes": expected_bytes},
        )
    if isinstance(embedding.data, bytes):
        tensor = _from_bytes(embedding.data, embedding.dtype, rows, width, expected_bytes, param)
    elif isinstance(embedding.data, str):
        tensor = _from_bytes(_base64(embedding.data, param), embedding.dtype, rows, width, expected_bytes, param)
    else:
        lengths = {len(row) for row in embedding.data}
        if len(embedding.data) != rows or lengths != {width}:
            raise PrecomputedShapeMismatch(
                f"{param}.data has {len(embedding.data)} rows of widths {sorted(lengths)}, "
                f"but shape says {[rows, width]}",
                param=f"{param}.data",
                details={"declared_shape": [rows, width], "rows": len(embedding.data), "widths": sorted(lengths)},
            )
        tensor = torch.tensor(embedding.data, dtype=torch.float32)
    finite = torch.isfinite(tensor)
    if not bool(finite.all()):
        # Said with the first place: 1e39 is a finite JSON number, but infinite as float32.
        row, column = (int(v) for v in (~finite).nonzero()[0])
        raise ValidationFailed(
            f"{param} contains NaN or infinite values (as float32), first at row {row}, column {column}",
            param=f"{param}.data",
            details={
                "errors": [{"loc": [param, "data", row, column], "msg": "values must be finite", "type": "finite"}]
            },
        )
    return tensor


def _base64(data: str, param: str) -> bytes:
    try:
        return decode_lenient_padding(data)
    except (binascii.Error, ValueError) as exc:
        raise ValidationFailed(
            f"{param}.data is not valid base64 ({exc})",
            param=f"{param}.data",
            details={"errors": [{"loc": [param, "data"], "msg": "invalid base64", "type": "base64"}]},
        ) from None


def _from_bytes(raw: bytes, dtype: str, rows: int, width: int, expected_bytes: int, param: str) -> torch.Tensor:
    if len(raw) != expected_bytes:
        raise PrecomputedShapeMismatch(
            f"{param}.data holds {len(raw)} bytes; shape {[rows, width]} of {dtype} needs {expected_bytes}",
            param=f"{param}.data",
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
