"""Tensors to wire payloads: the embedding encodings and JSON rendering shared by every route."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import orjson
import torch
from starlette.responses import Response

__all__ = ["JSONBytesResponse", "dumps_json", "embedding_payload", "l2_normalised_mean"]

_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def dumps_json(content: Any) -> bytes:
    """orjson, fast for large embeddings; the standard library for what orjson refuses.

    Client-sent values are echoed back (metadata, a model name): integers past 64 bits and lone
    surrogates are valid JSON to a parser but not to orjson, and must not turn an answer into a 500.
    """
    try:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError:
        return json.dumps(content, default=_jsonable, ensure_ascii=True).encode("ascii")


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


class JSONBytesResponse(Response):
    """JSON rendered by :func:`dumps_json`; numpy arrays serialise natively."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return dumps_json(content)


def _little_endian_bytes(rows: torch.Tensor) -> bytes:
    if rows.dtype == torch.bfloat16:
        return rows.contiguous().view(torch.int16).numpy().astype("<i2", copy=False).tobytes()
    return rows.numpy().astype(rows.numpy().dtype.newbyteorder("<"), copy=False).tobytes()


def embedding_payload(rows: torch.Tensor, *, encoding_format: str, dtype: str) -> dict[str, Any]:
    """``{"encoding_format", "dtype", "shape", "data"}`` for a float32 ``(rows, width)`` tensor."""
    cast = rows.to(_TORCH_DTYPES[dtype]).contiguous()
    data: Any
    if encoding_format == "base64":
        data = base64.b64encode(_little_endian_bytes(cast)).decode("ascii")
    else:
        # The values the requested dtype can hold, written as JSON numbers.
        data = cast.float().numpy()
    return {"encoding_format": encoding_format, "dtype": dtype, "shape": list(rows.shape), "data": data}


def l2_normalised_mean(rows: torch.Tensor) -> np.ndarray:
    """One vector per image: the mean of its rows, scaled to unit length."""
    mean = rows.mean(dim=0)
    return torch.nn.functional.normalize(mean, dim=0).numpy()
