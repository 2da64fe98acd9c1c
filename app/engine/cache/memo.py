"""Wire payloads already written for cached rows: a repeat answer splices bytes instead of encoding again.

Encoding one real-size item (2,691 x 3,584 rows) takes 100-460 ms here (bfloat16 to float32 base64):
most of a cache hit's time, which the memo turns into a dictionary lookup. Its own LRU, bounded in
bytes apart from the embedding cache. A payload is served only for the very rows it was written from
(a weak reference): rows replaced under the same hash (another encode, a shared-tier value in another
dtype) never get a foreign payload, and a payload whose rows are gone (evicted from the cache, their
answers sent) is dropped at once, since no later answer can splice it.

The budget counts the memory each payload holds, not its length: a ``bytes`` object's size as the
interpreter allocated it, a tensor's whole storage. Producers hand over payloads that own exactly their
bytes (``app.wire.encodings.data_json``); a tensor view of a larger storage is counted as that storage.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch

__all__ = ["Payload", "ResponseMemo", "payload_nbytes", "tensor_nbytes"]

# A response's encoding of one item's rows: JSON text of ``embedding.data``, or the tensor a
# safetensors response carries.
Payload = bytes | torch.Tensor


def tensor_nbytes(tensor: torch.Tensor) -> int:
    """The memory a tensor keeps alive: its whole storage, which a view shares with every other view."""
    return int(tensor.untyped_storage().nbytes())


def payload_nbytes(payload: Payload) -> int:
    """The memory ``payload`` holds: object header included for bytes, the whole storage for a tensor."""
    if isinstance(payload, bytes):
        return sys.getsizeof(payload)
    return tensor_nbytes(payload)


@dataclass(frozen=True, slots=True)
class _Kept:
    rows: weakref.ReferenceType[torch.Tensor]
    payload: Payload
    nbytes: int


class ResponseMemo:
    """Least-recently-used payloads by (content hash, variant), at most ``max_bytes``. Thread-safe."""

    # What an entry holds beside its payload: the key, the weak reference and its callback, the LRU's
    # links (measured with tracemalloc: 660 bytes; tests/unit/engine/test_memory_accounting.py).
    ENTRY_OVERHEAD = 640

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._kept: OrderedDict[tuple[str, Hashable], _Kept] = OrderedDict()
        self._bytes = 0
        # Re-entrant: a weak reference's callback runs in whichever thread frees the rows.
        self._lock = threading.RLock()

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
        size = payload_nbytes(payload) + self.ENTRY_OVERHEAD
        if size > self.max_bytes:
            return False
        key = (content_hash, variant)
        with self._lock:
            self._drop(key)
            reference = weakref.ref(rows, self._forget_when_freed(key))
            self._kept[key] = _Kept(reference, payload, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, evicted = self._kept.popitem(last=False)
                self._bytes -= evicted.nbytes
            return True

    def _forget_when_freed(self, key: tuple[str, Hashable]) -> Callable[[weakref.ReferenceType[torch.Tensor]], None]:
        def forget(reference: weakref.ReferenceType[torch.Tensor]) -> None:
            with self._lock:
                kept = self._kept.get(key)
                if kept is not None and kept.rows is reference:  # not a newer payload under the same key
                    self._drop(key)

        return forget

    def _drop(self, key: tuple[str, Hashable]) -> None:
        kept = self._kept.pop(key, None)
        if kept is not None:
            self._bytes -= kept.nbytes

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._kept)
