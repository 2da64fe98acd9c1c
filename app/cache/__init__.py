"""Embeddings by content hash: the local LRU, the optional shared Redis/Valkey tier, and the lookup order.

``TieredCache`` is what the scheduler talks to: local LRU first, then the shared store, then the encoder.
"""

from mmencode.app.cache.local import CachedEmbedding, EmbeddingCache, LRUEmbeddingCache, Payload, content_hash
from mmencode.app.cache.shared import SharedCache
from mmencode.app.cache.tiered import Hit, TieredCache

__all__ = [
    "CachedEmbedding",
    "EmbeddingCache",
    "Hit",
    "LRUEmbeddingCache",
    "Payload",
    "SharedCache",
    "TieredCache",
    "content_hash",
]
