"""Content hashes and the embedding cache behind them.

The hash is blake3 over the model's fingerprint (weights, config and processor config as shipped, the
compute dtype, the device kind and the image-processor backend: everything that changes the rows, see
``models/registry.py``) and the image's bytes, so the same image on the same model has the same hash on
every replica and after every restart. This module holds the in-process tier, an LRU bounded in bytes;
``shared.py`` holds the Redis/Valkey tier, ``tiered.py`` the order in which tiers are asked, and
``memo.py`` the answers' payloads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

import blake3
import torch

__all__ = ["CachedEmbedding", "LRUEmbeddingCache", "Tier", "content_hash", "scoped_key"]

# Where a hit came from, for the metrics.
Tier = Literal["local", "shared"]


def content_hash(model_fingerprint: str, image_bytes: bytes) -> str:
    """128-bit blake3 hex over the model identity and the image bytes exactly as received."""
    hasher = blake3.blake3(model_fingerprint.encode())
    hasher.update(image_bytes)
    return hasher.hexdigest(length=16)


def scoped_key(scope: str | None, content_hash: str) -> str:
    """The cache key of ``content_hash`` in a cache scope (a tenant's: ``--cache-scope tenant``); the hash
    itself in the global scope. Scopes are hex digests, so a scoped key is never another scope's, nor a hash."""
    return content_hash if scope is None else f"{scope}/{content_hash}"


@dataclass(frozen=True, slots=True)
class CachedEmbedding:
    rows: torch.Tensor  # (num_tokens, hidden_size), float32, CPU
    metadata: dict[str, Any]

    @property
    def nbytes(self) -> int:
        """The memory the rows keep alive: their whole storage (a view would pin all of it)."""
        return int(self.rows.untyped_storage().nbytes())


class LRUEmbeddingCache:
    """The local tier: least-recently-used eviction once what it holds exceeds ``max_bytes``. Thread-safe.

    An entry holds its rows and, beside them, the tensor's bookkeeping, the metadata, the key and the
    LRU's links: 1.25 KB measured (tests/unit/engine/test_memory_accounting.py), nothing beside a
    real tower's megabytes of rows, but 20 % of a tiny one's. The budget and the gauge count both.
    """

    name: Tier = "local"
    ENTRY_OVERHEAD = 1280

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, CachedEmbedding] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> CachedEmbedding | None:
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    async def get_many(self, hashes: list[str]) -> list[CachedEmbedding | None]:
        return [self.get(key) for key in hashes]

    def _cost(self, value: CachedEmbedding) -> int:
        return value.nbytes + self.ENTRY_OVERHEAD

    def put(self, key: str, value: CachedEmbedding) -> None:
        if self._cost(value) > self.max_bytes:
            return  # would evict everything and still not fit
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= self._cost(old)
            self._entries[key] = value
            self._bytes += self._cost(value)
            while self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= self._cost(evicted)

    async def aclose(self) -> None:
        """Nothing to release: the rows are plain memory."""

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)
