"""Mooncake's transfer engine: the bytes of a push, from this process's memory into the consumer's.

The engine comes from the ``mooncake`` extra (``mooncake-transfer-engine-non-cuda``; it loads
libibverbs and libnl, Debian's ``libibverbs1 libnl-3-200 libnl-route-3-200``), imported only when a
Mooncake push is configured: the base install never needs it. It starts as vLLM's consumer does
(``vllm/distributed/ec_transfer/ec_connector/mooncake/transfer.py``): ``P2PHANDSHAKE`` (no metadata
server: a peer is addressed as ``host:rpc_port``, the ``dst_session`` a reservation names), over
``tcp`` or ``rdma``.

A write registers the source rows with the engine, writes them with one synchronous batch per
destination session, and unregisters them: the rows are the request's own tensors, alive for the
call. Registrations are counted by address, so two pushes of the same cached rows may overlap.
Every call blocks: callers run them on a thread.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["MOONCAKE_HINT", "MooncakeTransfer", "MooncakeUnavailable", "local_address_towards", "require_mooncake"]

MOONCAKE_HINT = (
    "install the mooncake extra (pip install 'mmencode[mooncake]', which brings "
    "mooncake-transfer-engine-non-cuda 0.3.13.post1) and the libraries it loads (Debian: apt-get install "
    "libibverbs1 libnl-3-200 libnl-route-3-200)"
)


class MooncakeUnavailable(RuntimeError):
    """The Mooncake transfer engine does not import here; the message says what to install."""


def require_mooncake() -> Any:
    """``mooncake.engine.TransferEngine``, or :class:`MooncakeUnavailable` naming what is missing."""
    try:
        from mooncake.engine import TransferEngine
    except ImportError as exc:
        raise MooncakeUnavailable(f"a Mooncake push needs Mooncake's transfer engine ({exc}): {MOONCAKE_HINT}") from exc
    return TransferEngine


class MooncakeTransfer:
    """One transfer engine for the process's pushes. Thread-safe; every method blocks."""

    def __init__(self, hostname: str, protocol: str, device: str = "") -> None:
        self.hostname = hostname
        self.protocol = protocol
        self.device = device
        self._engine: Any = None
        self._lock = threading.Lock()
        self._registered: dict[int, list[int]] = {}  # address -> [bytes, users]

    def start(self) -> None:
        """Start the engine (idempotent): its handshake port and, for TCP, its data port."""
        with self._lock:
            if self._engine is not None:
                return
            engine = require_mooncake()()
            status = engine.initialize(self.hostname, "P2PHANDSHAKE", self.protocol, self.device)
            if status != 0:
                raise RuntimeError(
                    f"Mooncake's transfer engine did not start ({self.protocol} at {self.hostname}: status {status}; "
                    "its log lines above say why)"
                )
            self._engine = engine

    @property
    def session(self) -> str:
        """This engine's ``host:rpc_port``."""
        self.start()
        return f"{self.hostname}:{self._engine.get_rpc_port()}"

    def write(self, session: str, sources: Sequence[torch.Tensor], destinations: Sequence[int]) -> None:
        """Write each source tensor's bytes at the matching address of ``session`` (one batch)."""
        self.start()
        addresses = [source.data_ptr() for source in sources]
        lengths = [source.nbytes for source in sources]
        self._register(addresses, lengths)
        try:
            status = self._engine.batch_transfer_sync_write(session, addresses, list(destinations), lengths)
        finally:
            self._unregister(addresses)
        if status != 0:
            raise RuntimeError(f"Mooncake's write of {sum(lengths)} bytes to {session} failed (status {status})")

    def close(self) -> None:
        """Stop the engine: its ports close (a later push starts it again)."""
        with self._lock:
            engine, self._engine = self._engine, None
            if engine is not None and self._registered:
                engine.batch_unregister_memory(list(self._registered))
            self._registered.clear()
        del engine  # the binding's destructor stops its threads and closes its ports

    def _register(self, addresses: list[int], lengths: list[int]) -> None:
        with self._lock:
            new = [(a, n) for a, n in dict(zip(addresses, lengths, strict=True)).items() if a not in self._registered]
            if new and self._engine.batch_register_memory([a for a, _ in new], [n for _, n in new]) != 0:
                raise RuntimeError("Mooncake refused to register the rows' memory")
            for address, length in zip(addresses, lengths, strict=True):
                entry = self._registered.setdefault(address, [length, 0])
                entry[1] += 1

    def _unregister(self, addresses: list[int]) -> None:
        with self._lock:
            unused = []
            for address in addresses:
                entry = self._registered[address]
                entry[1] -= 1
                if entry[1] == 0:
                    unused.append(address)
                    del self._registered[address]
            if unused:
                self._engine.batch_unregister_memory(list(dict.fromkeys(unused)))


def local_address_towards(host: str) -> str:
    """This host's address on the route to ``host`` (what a consumer there reaches us at); no packet is sent."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((host.strip("[]"), 9))
            return str(probe.getsockname()[0])
        except OSError:
            return "127.0.0.1"
