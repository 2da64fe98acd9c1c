"""SGLang's language side of its encoder protocol (sglang 0.5.23, ``zmq_to_tokenizer``), for a load generator:
the ``POST /encode`` body its ``MMReceiverHTTP.encode`` sends, and the ZMQ PULL socket its tokenizer binds,
where every encoder pushes each part's rows.

A push is two frames: a pickled ``EmbeddingData`` without its rows (``req_id``, ``shape``, ``dtype``,
``grid_dim``...), then the rows' raw bytes; a failure is the first frame alone, with ``error_msg``. The
pickle is read here without SGLang installed: SGLang's classes become plain attribute holders.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import math
import pickle
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import zmq
import zmq.asyncio

__all__ = ["Push", "PushReceiver", "encode_body"]


def encode_body(image: str, embedding_port: int, encoder_url: str) -> dict[str, Any]:
    """One part of one request, as SGLang's language server posts it to an encoder's ``/encode``."""
    return {
        "encoder_idx": 0,
        "encoder_url": encoder_url,
        "mm_items": [image],  # a plain URL string: SGLang's shape when the item has no options
        "num_parts": 1,
        "part_idx": 0,
        "req_id": f"{uuid.uuid4().hex}_local_part_0",
        "modality": "IMAGE",
        "prefill_host": "127.0.0.1",
        "embedding_port": embedding_port,
        "time_stats_json": None,
    }


class _Attributes:
    """Stands in for any SGLang class in a pickle: keeps what it was built with."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.__dict__.update(kwargs)

    def __setstate__(self, state: Any) -> None:
        self.__dict__.update(state[0] if isinstance(state, tuple) else state)


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module.split(".")[0] == "sglang":
            return _Attributes
        return super().find_class(module, name)


@dataclass(frozen=True)
class Push:
    """One message as the language side received it, when its last byte arrived."""

    req_id: str
    arrived: float  # time.perf_counter()
    shape: tuple[int, ...] | None
    dtype: torch.dtype | None
    rows: bytes | None
    error: str | None

    def array(self) -> np.ndarray:
        """The rows as float32 (rows, width)."""
        assert self.rows is not None and self.dtype is not None and self.shape is not None
        return torch.frombuffer(bytearray(self.rows), dtype=self.dtype).reshape(self.shape).float().numpy()


class PushReceiver:
    """A PULL socket on loopback; :meth:`expect` a part's ``req_id`` before posting it, await its push."""

    def __init__(self) -> None:
        self._context = zmq.asyncio.Context()
        self._socket = self._context.socket(zmq.PULL)
        self._socket.setsockopt(zmq.RCVHWM, 0)
        self.port = self._socket.bind_to_random_port("tcp://127.0.0.1")
        self._waiting: dict[str, asyncio.Future[Push]] = {}
        self.unexpected = 0

    def expect(self, req_id: str) -> asyncio.Future[Push]:
        future: asyncio.Future[Push] = asyncio.get_running_loop().create_future()
        self._waiting[req_id] = future
        return future

    def forget(self, req_id: str) -> None:
        self._waiting.pop(req_id, None)

    async def _receive(self) -> None:
        while True:
            frames = await self._socket.recv_multipart()
            arrived = time.perf_counter()
            push = _parse(frames, arrived)
            future = self._waiting.pop(push.req_id, None)
            if future is None or future.done():
                self.unexpected += 1
            else:
                future.set_result(push)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[PushReceiver]:
        task = asyncio.create_task(self._receive())
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def close(self) -> None:
        self._socket.close(linger=0)
        self._context.term()


def _parse(frames: list[bytes], arrived: float) -> Push:
    header = _Unpickler(io.BytesIO(frames[0])).load()
    error = getattr(header, "error_msg", None)
    if error is not None or len(frames) < 2:
        return Push(header.req_id, arrived, None, None, None, error or "a push without rows")
    shape, dtype = tuple(header.shape), header.dtype
    expected = math.prod(shape) * dtype.itemsize
    if len(frames[1]) != expected:
        return Push(header.req_id, arrived, shape, dtype, None, f"{len(frames[1])} bytes of rows, not {expected}")
    return Push(header.req_id, arrived, shape, dtype, frames[1], None)
