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
import pybase64
import torch

from mmencode.app.wire.b64 import encode_ascii

__all__ = [
    "TORCH_DTYPES",
    "binary_rows",
    "data_json",
    "embedding_payload",
    "exact_bytes",
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


def _base64_source(rows: torch.Tensor, *, encoding_format: str, dtype: str) -> bytes:
    """The bytes a base64 format carries: raw little-endian rows, ``torch.save`` or ``numpy.save``."""
    if encoding_format == "npy":
        return npy_bytes(rows, dtype)
    cast = rows.to(TORCH_DTYPES[dtype]).contiguous()
    return torch_save_bytes(cast) if encoding_format == "pt" else little_endian_bytes(cast)


def embedding_payload(rows: torch.Tensor, *, encoding_format: str, dtype: str) -> dict[str, Any]:
    """``{"encoding_format", "dtype", "shape", "data"}`` for a float32 ``(rows, width)`` tensor."""
    data: Any
    if encoding_format == "float":
        # The values the requested dtype can hold, written as JSON numbers.
        data = rows.to(TORCH_DTYPES[dtype]).float().numpy()
    else:
        data = encode_ascii(_base64_source(rows, encoding_format=encoding_format, dtype=dtype))
    return {"encoding_format": encoding_format, "dtype": dtype, "shape": list(rows.shape), "data": data}


def data_json(rows: torch.Tensor, *, encoding_format: str, dtype: str) -> bytes:
    """The JSON text of :func:`embedding_payload`'s ``data``, exactly as orjson writes it in a response.

    Kept whole in the response memo beside the rows, it is spliced into later responses as it is
    (``orjson.Fragment``): a hit neither re-encodes base64 nor re-writes numbers. So it must hold no more
    memory than its length: ``orjson.dumps`` returns its output buffer as it grew, about 2x the text for
    numbers and 6-12x for a string (room for escaping it never needed), and the memo, which counts
    lengths, held 5-6x its budget that way (bench/README.md, "Memory"). A base64 string needs no
    escaping: it is quoted here directly, in one allocation of its exact size.
    """
    if encoding_format == "float":
        numbers = embedding_payload(rows, encoding_format=encoding_format, dtype=dtype)["data"]
        return exact_bytes(orjson.dumps(numbers, option=orjson.OPT_SERIALIZE_NUMPY))
    encoded = pybase64.b64encode(_base64_source(rows, encoding_format=encoding_format, dtype=dtype))
    return b"".join((b'"', encoded, b'"'))


def exact_bytes(data: bytes) -> bytes:
    """A copy of ``data`` that owns exactly its length (a buffer that grew keeps its spare capacity)."""
    return memoryview(data).tobytes()


def binary_rows(rows: torch.Tensor, dtype: str) -> torch.Tensor:
    """``rows`` as the contiguous tensor of ``dtype`` a safetensors response carries.

    Float32 rows come back as they are (no copy); another dtype is a new tensor that owns its values.
    """
    return rows.to(TORCH_DTYPES[dtype]).contiguous()
