"""Wire payloads already written for cached rows: a repeat answer splices bytes instead of encoding again.

Encoding one real-size item (2,691 x 3,584 rows) takes 100-460 ms here (bfloat16 to float32 base64):
most of a cache hit's time, which the memo turns into a dictionary lookup. Its own LRU, bounded in
bytes apart from the embedding cache. A payload is served only for the very rows it was written from
(a weak reference): rows replaced under the same hash (another encode, a shared-tier value in another
dtype) never get a foreign payload.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass

import torch

__all__ = ["Payload", "ResponseMemo", "payload_nbytes"]

# A response's encoding of one item's rows: JSON text of ``embedding.data``, or the tensor a
# safetensors response carries.
Payload = bytes | torch.Tensor


def payload_nbytes(payload: Payload) -> int:
    if isinstance(payload, bytes):
        return len(payload)
    return payload.numel() * payload.element_size()


@dataclass(frozen=True, slots=True)
class _Kept:
    rows: weakref.ReferenceType[torch.Tensor]
    payload: Payload
    nbytes: int


class ResponseMemo:
    """Least-recently-used payloads by (content hash, variant), at most ``max_bytes``. Thread-safe."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._kept: OrderedDict[tuple[str, Hashable], _Kept] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def payload(self, content_hash: str, rows: torch.Tensor, variant: Hashable) -> Payload | None:
        """The payload kept for ``variant`` of exactly these ``rows`` (the same tensor), if any."""
        key = (content_hash, variant)
        with self._lock:
            kept = self._kept.get(key)
            if kept is None:
                return None
            if kept.rows() is not rows:
                return None
            self._kept.move_to_end(key)
            return kept.payload

    def keep_payload(self, content_hash: str, rows: torch.Tensor, variant: Hashable, payload: Payload) -> bool:
        """Keep ``payload`` as written from ``rows``; an older payload of other rows is replaced."""
        size = payload_nbytes(payload)
        if size > self.max_bytes:
            return False
        key = (content_hash, variant)
        with self._lock:
            old = self._kept.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._kept[key] = _Kept(weakref.ref(rows), payload, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, evicted = self._kept.popitem(last=False)
                self._bytes -= evicted.nbytes
            return True

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._kept)
