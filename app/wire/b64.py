"""Base64 out, at SIMD speed (pybase64): embeddings leave the service as base64 text in JSON answers."""

from __future__ import annotations

import pybase64

__all__ = ["encode_ascii"]


def encode_ascii(data: bytes | bytearray | memoryview) -> str:
    """``base64.b64encode(data).decode("ascii")`` without the intermediate bytes copy."""
    return pybase64.b64encode_as_string(data)
