"""What a client of mmencode does, for the bench scripts and the tests: a free loopback port, a data URI, waiting
for a server to be ready, and decoding a response item's rows.

No pytest and no mmencode import here: ``python -m bench.*`` uses this module with the project's runtime
dependencies alone (httpx, numpy; torch for ``pt`` rows).
"""

from __future__ import annotations

import base64
import io
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

__all__ = ["bare_base64", "data_uri", "decode_rows", "free_port", "wait_ready"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def bare_base64(data: bytes) -> str:
    """A file as an item's field takes it without a data URI: its base64 alone."""
    return base64.b64encode(data).decode()


def data_uri(data: bytes, mime: str = "image/jpeg") -> str:
    return f"data:{mime};base64," + bare_base64(data)


def decode_rows(embedding: dict[str, Any]) -> np.ndarray:
    """What a client does with one item's ``embedding`` object: back to a float32 (rows, width) array,
    whatever its encoding (``float``, ``base64``, ``pt``, ``npy``) and dtype."""
    shape, data, dtype = embedding["shape"], embedding["data"], embedding["dtype"]
    fmt = embedding["encoding_format"]
    if fmt == "float":
        return np.asarray(data, dtype=np.float32).reshape(shape)
    raw = base64.b64decode(data)
    if fmt == "pt":
        import torch  # only for this encoding: the rest needs numpy alone

        return np.asarray(torch.load(io.BytesIO(raw), weights_only=True).float().numpy())
    if fmt == "npy":
        return np.load(io.BytesIO(raw), allow_pickle=False).astype(np.float32)
    if dtype == "bfloat16":  # numpy has no bfloat16: its bits are a float32's upper half, so this is exact
        return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
    return np.frombuffer(raw, dtype={"float32": "<f4", "float16": "<f2"}[dtype]).astype(np.float32).reshape(shape)


def wait_ready(
    url: str,
    process: subprocess.Popen[bytes] | None = None,
    timeout: float = 180,
    log_path: Path | None = None,
    path: str = "/ready",
) -> None:
    """Returns once ``url + path`` answers 200. Raises at once when ``process`` exits (with the tail of
    ``log_path``) or /ready reports a failed load, and after ``timeout`` seconds otherwise."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            tail = log_path.read_text()[-4000:] if log_path else ""
            raise RuntimeError(f"server exited with {process.returncode}: {tail}")
        try:
            response = httpx.get(url + path, timeout=5)
        except httpx.HTTPError as exc:
            last = repr(exc)
        else:
            if response.status_code == 200:
                return
            last = response.text
            if _load_failed(response):
                break
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout}s: {last}")


def _load_failed(response: httpx.Response) -> bool:
    try:
        return bool(response.json()["error"]["details"]["phase"] == "failed")
    except (ValueError, KeyError, TypeError):
        return False
