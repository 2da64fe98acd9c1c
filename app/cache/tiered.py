"""The lookup order: the local LRU, then the shared store (when configured), then the encoder."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Literal

import torch

from mmencode.app.cache.local import CachedEmbedding, LRUEmbeddingCache, Payload
from mmencode.app.cache.shared import SharedCache
from mmencode.app.metrics import Metrics

__all__ = ["Hit", "TieredCache"]

Tier = Literal["local", "shared"]


@dataclass(frozen=True, slots=True)
class Hit:
    value: CachedEmbedding
    tier: Tier


class TieredCache:
    def __init__(self, local: LRUEmbeddingCache, shared: SharedCache | None, metrics: Metrics) -> None:
        self.local = local
        self.shared = shared
        self.metrics = metrics

    async def get_many(self, hashes: list[str]) -> list[Hit | None]:
        """A hit or ``None`` per hash, in order. Shared hits are kept locally for the next time."""
        hits: list[Hit | None] = []
        for content_hash in hashes:
            value = self.local.get(content_hash)
            self._count("local", value)
            hits.append(None if value is None else Hit(value, "local"))
        if self.shared is None:
            return hits
        missing = [i for i, hit in enumerate(hits) if hit is None]
        if not missing:
            return hits
        found = await self.shared.get_many([hashes[i] for i in missing])
        for i, value in zip(missing, found, strict=True):
            self._count("shared", value)
            if value is not None:
                self.local.put(hashes[i], value)
                hits[i] = Hit(value, "shared")
        return hits

    def put(self, content_hash: str, value: CachedEmbedding) -> None:
        """Kept locally now; written to the shared store in the background."""
        self.local.put(content_hash, value)
        if self.shared is not None:
            self.shared.put(content_hash, value)

    def payload(self, content_hash: str, rows: torch.Tensor, variant: Hashable) -> Payload | None:
        """A wire payload written earlier from these rows (local tier only: payloads never travel)."""
        return self.local.payload(content_hash, rows, variant)

    def keep_payload(self, content_hash: str, rows: torch.Tensor, variant: Hashable, payload: Payload) -> bool:
        return self.local.keep_payload(content_hash, rows, variant, payload)

    @property
    def nbytes(self) -> int:
        return self.local.nbytes

    async def aclose(self) -> None:
        if self.shared is not None:
            await self.shared.aclose()

    def _count(self, tier: Tier, value: CachedEmbedding | None) -> None:
        self.metrics.cache_lookups.labels(tier, "hit" if value is not None else "miss").inc()
