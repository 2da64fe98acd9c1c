"""The consumer's control channel: vLLM's ``ECMooncakeConnector`` reservations, over ZMQ REQ/REP.

vLLM 0.32's consumer (``vllm/distributed/ec_transfer/ec_connector/mooncake/control.py``,
``ConsumerControlServer``) serves one REP socket per tensor-parallel rank, at ``ec_port`` + rank.
Requests and replies are single JSON frames; a reply is ``{"ok": true, "result": ...}`` or
``{"ok": false, "error": "<text>"}``. The operations this producer uses:

- ``{"op": "peers"}`` -> ``{"ports": [...]}``: every rank's control port (same host);
- ``{"op": "reserve_batch", "items": [{transfer_id, mm_hash, nbytes, shape, dtype}]}`` ->
  ``{"items": [{"ok", "result" | "error"}]}``, each result ``{reservation_id, dst_session, dst_ptr,
  nbytes, write, ready, cached}`` (or ``{"cancelled": true}`` for a transfer id cancelled before);
- ``{"op": "complete_batch", "items": [{transfer_id, reservation_id}]}`` ->
  ``{"items": [{"completed", "became_ready"}]}``;
- ``{"op": "cancel", transfer_id, reservation_id, "abandon": true}`` -> ``{"cancelled": bool}``;
- ``{"op": "status", transfer_id}`` -> ``{mm_hash, ready, ...}``, or null once gone.

A REQ socket must alternate send and receive: one that timed out is closed, never reused. Each
exchange borrows a socket of its own, so concurrent requests to one consumer do not queue behind
each other.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import zmq
import zmq.asyncio

__all__ = ["ControlChannel", "ControlRefused", "ControlUnreachable"]

# Idle sockets kept per address for the next exchange; more are opened when busier.
_IDLE_SOCKETS = 8


class ControlRefused(Exception):
    """The consumer answered ``ok: false`` (its own words: a full pool, a conflicting reservation...)."""


class ControlUnreachable(Exception):
    """No answer within the timeout, or an answer that is not the protocol's."""


class ControlChannel:
    """Requests to consumers' control sockets, each bounded by ``timeout_s``."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._context = zmq.asyncio.Context()
        self._idle: dict[str, list[zmq.asyncio.Socket]] = {}
        # Each consumer's shards, as its `peers` answered; dropped when a push to it fails (a restarted
        # consumer may come back with another topology).
        self._shards: dict[str, list[str]] = {}

    async def request(self, address: str, payload: dict[str, Any]) -> Any:
        """The ``result`` of one exchange; raises :class:`ControlRefused` or :class:`ControlUnreachable`."""
        socket = self._borrow(address)
        try:
            async with asyncio.timeout(self.timeout_s):
                await socket.send(orjson.dumps(payload))
                raw = await socket.recv()
        except TimeoutError:
            socket.close(linger=0)
            raise ControlUnreachable(
                f"{address} did not answer {payload.get('op')!r} within {self.timeout_s:g} s"
            ) from None
        except BaseException:
            socket.close(linger=0)  # cancelled or failed mid-exchange: the REQ state is lost
            raise
        self._give_back(address, socket)
        try:
            reply = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise ControlUnreachable(f"{address} answered {payload.get('op')!r} with a non-JSON frame") from None
        if not isinstance(reply, dict) or "ok" not in reply:
            raise ControlUnreachable(f"{address} answered {payload.get('op')!r} outside the protocol: {reply!r:.200}")
        if not reply["ok"]:
            raise ControlRefused(str(reply.get("error") or "refused without a reason"))
        return reply.get("result")

    async def shards(self, consumer: str) -> list[str]:
        """Every tensor-parallel rank's control address of ``consumer`` (its ``peers``), cached."""
        known = self._shards.get(consumer)
        if known is not None:
            return known
        result = await self.request(consumer, {"op": "peers"})
        ports = result.get("ports") if isinstance(result, dict) else None
        if not isinstance(ports, list) or not ports or not all(isinstance(p, int) for p in ports):
            raise ControlUnreachable(f"{consumer} answered 'peers' without a list of ports: {result!r:.200}")
        host = consumer.rsplit(":", 1)[0]
        shards = [f"{host}:{port}" for port in ports]
        self._shards[consumer] = shards
        return shards

    def forget(self, consumer: str) -> None:
        """Ask ``consumer`` for its shards again next time."""
        self._shards.pop(consumer, None)

    def close(self) -> None:
        self._idle.clear()
        # Every socket, borrowed ones included: an exchange still waiting ends with an error.
        self._context.destroy(linger=0)

    def _borrow(self, address: str) -> zmq.asyncio.Socket:
        idle = self._idle.get(address)
        if idle:
            return idle.pop()
        socket = self._context.socket(zmq.REQ)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.IPV6, 1)
        socket.connect(address)
        return socket

    def _give_back(self, address: str, socket: zmq.asyncio.Socket) -> None:
        idle = self._idle.setdefault(address, [])
        if len(idle) < _IDLE_SOCKETS:
            idle.append(socket)
        else:
            socket.close(linger=0)
