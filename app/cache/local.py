"""Content hashes and the embedding cache behind them.

The hash is blake3 over the model's fingerprint (weights, config and processor config as shipped, the
compute dtype and the device kind: everything that changes the rows, see ``models/registry.py``) and
the image's bytes, so the same image on the same model has the same hash on every replica and after
every restart. This module holds the in-process tier: an LRU bounded in bytes; ``shared.py`` holds the
Redis/Valkey tier and ``tiered.py`` the order in which they are asked.

Beside an entry's rows the LRU keeps the wire payloads already written from them, one per variant
(encoding format, dtype, pooling): a hit answers with the same bytes the first response wrote instead
of encoding the rows again. Payload bytes count in the same budget as rows; an entry (rows and
payloads) is evicted whole, least recently used first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

import blake3
import torch

__all__ = ["CachedEmbedding", "EmbeddingCache", "LRUEmbeddingCache", "Payload", "content_hash", "payload_nbytes"]

# A response's encoding of one item's rows: JSON text of ``embedding.data``, or the tensor a
# safetensors response carries.
Payload = bytes | torch.Tensor


def payload_nbytes(payload: Payload) -> int:
    if isinstance(payload, bytes):
        return len(payload)
    return payload.numel() * payload.element_size()


def content_hash(model_fingerprint: str, image_bytes: bytes) -> str:
    """128-bit blake3 hex over the model identity and the image bytes exactly as received."""
    hasher = blake3.blake3(model_fingerprint.encode())
    hasher.update(image_bytes)
    return hasher.hexdigest(length=16)


@dataclass(frozen=True, slots=True)
class CachedEmbedding:
    rows: torch.Tensor  # (num_tokens, hidden_size), float32, CPU
    metadata: dict[str, Any]

    @property
    def nbytes(self) -> int:
        return self.rows.numel() * self.rows.element_size()


class EmbeddingCache(Protocol):
    def get(self, key: str) -> CachedEmbedding | None: ...

    def put(self, key: str, value: CachedEmbedding) -> None: ...

    @property
    def nbytes(self) -> int: ...


@dataclass(slots=True)
class _Entry:
    value: CachedEmbedding
    nbytes: int  # rows and payloads
    payloads: dict[Hashable, Payload] = field(default_factory=dict)


class LRUEmbeddingCache:
    """Least-recently-used eviction once the rows and payloads held exceed ``max_bytes``. Thread-safe."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> CachedEmbedding | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry.value

    def put(self, key: str, value: CachedEmbedding) -> None:
        if value.nbytes > self.max_bytes:
            return  # would evict everything and still not fit
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes  # its payloads were written from the old rows: gone with them
            self._entries[key] = _Entry(value, value.nbytes)
            self._bytes += value.nbytes
            self._evict()

    def payload(self, key: str, rows: torch.Tensor, variant: Hashable) -> Payload | None:
        """The payload kept for ``variant`` of the entry that holds exactly ``rows`` (the same tensor)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.value.rows is not rows:
                return None
            return entry.payloads.get(variant)

    def keep_payload(self, key: str, rows: torch.Tensor, variant: Hashable, payload: Payload) -> bool:
        """Keep ``payload`` beside the entry's rows if it still holds ``rows`` and the entry fits the budget.

        The identity check keeps a payload with the rows it was written from: an entry replaced in the
        meantime (another encode, a shared-tier value in another dtype) is not given a foreign payload.
        """
        size = payload_nbytes(payload)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.value.rows is not rows or variant in entry.payloads:
                return False
            if entry.nbytes + size > self.max_bytes:
                return False
            entry.payloads[variant] = payload
            entry.nbytes += size
            self._bytes += size
            # The entry fits alone and is now the most recent: eviction stops before it.
            self._entries.move_to_end(key)
            self._evict()
            return True

    def _evict(self) -> None:
        while self._bytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= evicted.nbytes

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)
