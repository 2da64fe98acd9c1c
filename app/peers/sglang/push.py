"""Where and how SGLang's parts are pushed: the scheduler ranks' registrations, and one ZMQ PUSH per message.

Where to push follows from ``embedding_port``: an int (``zmq_to_tokenizer``) or a list of ints
(``zmq_to_scheduler`` with ports) on ``prefill_host``; ``None`` (``zmq_to_scheduler``): every
``host:port`` the scheduler ranks register through ``/scheduler_receive_url``, which may arrive before
or after ``/encode``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import zmq

from mmencode.app.engine.errors import InvalidRequest

__all__ = ["ReceiverRegistry", "ZmqPusher", "endpoint_of_url", "tcp_endpoint"]


@dataclass
class _Registration:
    receive_count: int | None  # None until the first rank registers
    urls: set[str] = field(default_factory=set)
    created: float = field(default_factory=time.monotonic)
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class ReceiverRegistry:
    """``/scheduler_receive_url`` registrations by part id; one may come before its ``/encode``."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._entries: dict[str, _Registration] = {}

    def register(self, req_id: str, receive_count: int, url: str) -> None:
        self._expire()
        entry = self._entries.setdefault(req_id, _Registration(receive_count))
        if entry.receive_count is None:  # /encode came first and is waiting
            entry.receive_count = receive_count
        if entry.receive_count != receive_count:
            raise InvalidRequest(
                f"inconsistent receive_count for req_id={req_id}: registered {entry.receive_count}, "
                f"got {receive_count}",
                param="receive_count",
                details={"req_id": req_id, "registered": entry.receive_count, "given": receive_count},
            )
        entry.urls.add(url)
        entry.changed.set()

    async def wait_for_all(self, req_id: str, timeout_s: float) -> tuple[list[str], int | None]:
        """The URLs once ``receive_count`` have registered, or what has at the deadline; and the count."""
        entry = self._entries.setdefault(req_id, _Registration(receive_count=None))
        deadline = time.monotonic() + timeout_s
        try:
            while entry.receive_count is None or len(entry.urls) < entry.receive_count:
                entry.changed.clear()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(entry.changed.wait(), remaining)
            return sorted(entry.urls), entry.receive_count
        finally:
            self._entries.pop(req_id, None)

    def _expire(self) -> None:
        cutoff = time.monotonic() - self.ttl_s
        for req_id in [k for k, v in self._entries.items() if v.created < cutoff]:
            del self._entries[req_id]


def tcp_endpoint(host: str, port: int) -> str:
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # IPv6
    return f"tcp://{host}:{port}"


def endpoint_of_url(url: str) -> str:
    host, _, port = url.rpartition(":")
    return tcp_endpoint(host.strip("[]"), int(port))


class ZmqPusher:
    """One PUSH socket per message, bounded in time: a language server that is gone never blocks."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_ms = int(timeout_s * 1000)
        self._context = zmq.Context()

    def push(self, endpoint: str, frames: Sequence[bytes | memoryview]) -> None:
        """Blocking; raises ``zmq.Again`` when the peer does not take the message in time."""
        sock = self._context.socket(zmq.PUSH)
        try:
            # IMMEDIATE: queue only to a connected peer, so an absent one times out instead of
            # holding the message forever; SNDTIMEO bounds that wait.
            sock.setsockopt(zmq.IMMEDIATE, 1)
            sock.setsockopt(zmq.SNDTIMEO, self.timeout_ms)
            if endpoint.startswith("tcp://["):
                sock.setsockopt(zmq.IPV6, 1)
            sock.connect(endpoint)
            tracker = sock.send_multipart(list(frames), copy=False, track=True)
            if tracker is not None:
                tracker.wait(self.timeout_ms / 1000)
        finally:
            # Lingering lets the I/O thread finish delivering what was queued, for at most the timeout.
            sock.close(linger=self.timeout_ms)

    def close(self) -> None:
        self._context.destroy(linger=0)
