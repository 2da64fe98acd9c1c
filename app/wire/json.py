"""JSON rendering for every answer: orjson, fast for large embeddings; the standard library for what orjson refuses."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson

__all__ = ["dumps_json"]


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
