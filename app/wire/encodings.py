"""Embedding rows to wire payloads: ``base64``, ``float``, ``pt``, ``npy`` and ``safetensors``, in one place.

``pt`` and ``npy`` are what vLLM's ``image_embeds`` content parts take as they are
(``vllm/multimodal/media/image.py: ImageEmbeddingMediaIO``): base64 of ``torch.save`` bytes, read
with ``torch.load(weights_only=True)``, or of ``numpy.save`` bytes, read with ``allow_pickle=False``.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import orjson
import torch

from mmencode.app.wire.b64 import encode_ascii

__all__ = [
    "TORCH_DTYPES",
    "binary_rows",
    "data_json",
    "embedding_payload",
    "little_endian_bytes",
    "npy_bytes",
    "torch_save_bytes",
]

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# numpy has no bfloat16: `npy` carries float32 or float16 only (the request schema refuses the pair).
_NUMPY_DTYPES = {"float32": "<f4", "float16": "<f2"}


def little_endian_bytes(rows: torch.Tensor) -> bytes:
    """The row-major little-endian bytes of ``rows`` in its own dtype."""
    rows = rows.contiguous()
    if rows.dtype == torch.bfloat16:
        return rows.view(torch.int16).numpy().astype("<i2", copy=False).tobytes()
    return rows.numpy().astype(rows.numpy().dtype.newbyteorder("<"), copy=False).tobytes()


def torch_save_bytes(rows: torch.Tensor) -> bytes:
    """``torch.save`` of a tensor that owns exactly its rows.

    ``torch.save`` writes a tensor's whole storage: a view into a batch's output would carry every
    other item of the batch along. ``clone`` gives the item its own compact storage.
    """
    buffer = io.BytesIO()
    torch.save(rows.detach().cpu().contiguous().clone(), buffer)
    return buffer.getvalue()


def npy_bytes(rows: torch.Tensor, dtype: str) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, rows.float().numpy().astype(_NUMPY_DTYPES[dtype]), allow_pickle=False)
    return buffer.getvalue()


def embedding_payload(rows: torch.Tensor, *, encoding_format: str, dtype: str) -> dict[str, Any]:
    """``{"encoding_format", "dtype", "shape", "data"}`` for a float32 ``(rows, width)`` tensor."""
    cast = rows.to(TORCH_DTYPES[dtype]).contiguous()
    data: Any
    if encoding_format == "base64":
        data = encode_ascii(little_endian_bytes(cast))
    elif encoding_format == "pt":
        data = encode_ascii(torch_save_bytes(cast))
    elif encoding_format == "npy":
        data = encode_ascii(npy_bytes(rows, dtype))
    else:
        # The values the requested dtype can hold, written as JSON numbers.
        data = cast.float().numpy()
    return {"encoding_format": encoding_format, "dtype": dtype, "shape": list(rows.shape), "data": data}


def data_json(rows: torch.Tensor, *, encoding_format: str, dtype: str) -> bytes:
    """The JSON text of :func:`embedding_payload`'s ``data``, exactly as orjson writes it in a response.

    Kept whole in the cache beside the rows, it is spliced into later responses as it is
    (``orjson.Fragment``): a hit neither re-encodes base64 nor re-writes numbers.
    """
    data = embedding_payload(rows, encoding_format=encoding_format, dtype=dtype)["data"]
    return orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY)


def binary_rows(rows: torch.Tensor, dtype: str) -> torch.Tensor:
    """``rows`` as the contiguous tensor of ``dtype`` a safetensors response carries.

    Float32 rows come back as they are (no copy); another dtype is a new tensor that owns its values.
    """
    return rows.to(TORCH_DTYPES[dtype]).contiguous()
