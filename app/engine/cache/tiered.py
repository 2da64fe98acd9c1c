"""The lookup order over cache tiers: the local LRU, then the shared store (when configured), then the encoder.

Every tier answers one async interface (:class:`CacheTier`); a hit in a later tier is kept in the
earlier ones, so the next lookup stops sooner.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from mmencode.app.engine.cache.lease import Leases
from mmencode.app.engine.cache.local import CachedEmbedding, LRUEmbeddingCache, Tier
from mmencode.app.metrics import Metrics

__all__ = ["CacheTier", "Hit", "TieredCache"]


class CacheTier(Protocol):
    """One place embeddings are kept: the process's LRU, or a store shared by replicas."""

    name: Tier

    async def get_many(self, hashes: list[str]) -> list[CachedEmbedding | None]:
        """A value or ``None`` per hash, in order; never raises (a tier that fails answers misses)."""
        ...

    def put(self, content_hash: str, value: CachedEmbedding) -> None:
        """Keep ``value``; a remote tier writes in the background. Never raises."""
        ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Hit:
    value: CachedEmbedding
    tier: Tier


class TieredCache:
    """The tiers in lookup order, built whole once the model (whose fingerprint names shared keys) is known."""

    def __init__(self, tiers: Sequence[CacheTier], metrics: Metrics, *, leases: Leases | None = None) -> None:
        self.tiers = tuple(tiers)
        self.metrics = metrics
        # Leases on the shared tier's keys: one encode per item across replicas (app/engine/cache/lease.py).
        self.leases = leases

    async def get_many(self, hashes: list[str]) -> list[Hit | None]:
        """A hit or ``None`` per hash, in order. Hits are kept in the tiers asked before the one that had it."""
        hits: list[Hit | None] = [None] * len(hashes)
        missing = list(range(len(hashes)))
        for depth, tier in enumerate(self.tiers):
            if not missing:
                break
            found = await tier.get_many([hashes[i] for i in missing])
            still_missing = []
            for i, value in zip(missing, found, strict=True):
                self.metrics.cache_lookups.labels(tier.name, "hit" if value is not None else "miss").inc()
                if value is None:
                    still_missing.append(i)
                    continue
                hits[i] = Hit(value, tier.name)
                for earlier in self.tiers[:depth]:
                    earlier.put(hashes[i], value)
            missing = still_missing
        return hits

    def peek_local(self, key: str) -> CachedEmbedding | None:
        """The first tier's value, without waiting (the in-process LRU answers at once)."""
        first = self.tiers[0] if self.tiers else None
        return first.get(key) if isinstance(first, LRUEmbeddingCache) else None

    def put(self, content_hash: str, value: CachedEmbedding) -> None:
        """Kept in every tier: locally now, in a shared store in the background."""
        for tier in self.tiers:
            tier.put(content_hash, value)

    def keep_local(self, content_hash: str, value: CachedEmbedding) -> None:
        """Kept in the tiers before the last (a value read from the shared store, which has it already)."""
        for tier in self.tiers[:-1]:
            tier.put(content_hash, value)

    async def aclose(self) -> None:
        if self.leases is not None:
            await self.leases.aclose()
        for tier in self.tiers:
            await tier.aclose()
