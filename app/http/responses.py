"""JSON rendering shared by every route; embedding encodings live in :mod:`app.wire.encodings`."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson
import torch
from starlette.responses import Response

__all__ = ["JSONBytesResponse", "dumps_json", "l2_normalised_mean"]


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


def l2_normalised_mean(rows: torch.Tensor) -> np.ndarray:
    """One vector per image: the mean of its rows, scaled to unit length."""
    mean = rows.mean(dim=0)
    return torch.nn.functional.normalize(mean, dim=0).numpy()
