"""Embeddings by content hash: the local LRU, the optional shared Redis/Valkey tier, the lookup order over
them, and the memo of answers' payloads.

``TieredCache`` is what the scheduler talks to: local LRU first, then the shared store, then the encoder.
"""

from mmencode.app.engine.cache.lease import Claim, Leases
from mmencode.app.engine.cache.local import CachedEmbedding, LRUEmbeddingCache, content_hash, scoped_key
from mmencode.app.engine.cache.memo import Payload, ResponseMemo
from mmencode.app.engine.cache.shared import SharedCache
from mmencode.app.engine.cache.tiered import CacheTier, Hit, TieredCache

__all__ = [
    "CacheTier",
    "CachedEmbedding",
    "Claim",
    "Hit",
    "LRUEmbeddingCache",
    "Leases",
    "Payload",
    "ResponseMemo",
    "SharedCache",
    "TieredCache",
    "content_hash",
    "scoped_key",
]
