"""The shared tier: embeddings in Redis or Valkey, so every replica answers every hash.

The tier is an optimisation, never a dependency. Every failure (server down, slow, full, a value this
version cannot read) is a miss: the caller encodes and the request is served. After a failure the
tier rests for ``retry_after_s`` (no request pays the timeout again meanwhile), says so once in the
log, and is tried again afterwards, so a restarted server is used again without restarting replicas.

One key per item, ``mmencode:<format version>:<model fingerprint>:<content hash>``, holding a
safetensors blob: the rows as one tensor in the storage dtype, with the shape, format version and
the item's metadata in the header. The version is in the key and in the header, so a replica of a
future layout neither reads nor overwrites these values.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from concurrent.futures import Executor
from typing import cast

import orjson
import redis.asyncio as aioredis
import safetensors.torch
import torch
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from mmencode.app.engine.cache.local import CachedEmbedding, Tier
from mmencode.app.engine.threads import in_executor
from mmencode.app.metrics import Metrics

__all__ = ["FORMAT_VERSION", "SharedCache", "decode_value", "encode_value"]

logger = logging.getLogger("mmencode.cache")

FORMAT_VERSION = "1"
_FORMAT_NAME = "mmencode-embedding"
_TENSOR = "rows"
# Values past this go through a thread: serialising a 40 MB tensor must not stall the event loop.
_OFFLOAD_BYTES = 1 << 20


def encode_value(value: CachedEmbedding, store_dtype: torch.dtype) -> bytes:
    """A safetensors blob: the rows in ``store_dtype``, the metadata and format version in its header."""
    rows = value.rows.to(store_dtype).contiguous()
    header = {"format": _FORMAT_NAME, "version": FORMAT_VERSION, "metadata": json.dumps(value.metadata)}
    return safetensors.torch.save({_TENSOR: rows}, metadata=header)


def decode_value(blob: bytes) -> CachedEmbedding:
    """Rows as float32 (what the service computes with) and metadata; ``ValueError`` if foreign or corrupt."""
    if len(blob) < 8:
        raise ValueError("value too short for a safetensors header")
    header_len = int.from_bytes(blob[:8], "little")
    try:
        header = orjson.loads(blob[8 : 8 + header_len])
        meta = header["__metadata__"]
        if meta.get("format") != _FORMAT_NAME or meta.get("version") != FORMAT_VERSION:
            raise ValueError(f"not a version-{FORMAT_VERSION} mmencode value")
        metadata = json.loads(meta["metadata"])
        rows = safetensors.torch.load(blob)[_TENSOR]
    except ValueError:
        raise
    except Exception as exc:  # a bad header, or safetensors' own error on a truncated body
        raise ValueError(f"unreadable value: {type(exc).__name__}: {exc}") from None
    if rows.ndim != 2 or not isinstance(metadata, dict):
        raise ValueError("value does not hold (rows, width) embeddings")
    return CachedEmbedding(rows.float(), metadata)


class SharedCache:
    """Async client of the shared store, the shared tier. ``get_many`` and ``put`` never raise."""

    name: Tier = "shared"

    def __init__(
        self,
        url: str,
        *,
        fingerprint: str,
        store_dtype: torch.dtype,
        ttl_s: int,
        max_value_bytes: int,
        timeout_s: float,
        metrics: Metrics,
        retry_after_s: float = 1.0,
        max_pending_writes: int = 64,
        max_pending_bytes: int = 256 << 20,
        executor: Executor | None = None,
    ) -> None:
        self._executor = executor  # large values' (de)serialisation; None: the event loop's default executor
        self._client: aioredis.Redis = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            # One try: a miss costs an encode, a retry loop would cost every request its latency.
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
        )
        self._prefix = f"mmencode:{FORMAT_VERSION}:{fingerprint}:"
        self.location = _redacted(url)
        self.store_dtype = store_dtype
        self.ttl_s = ttl_s
        self.max_value_bytes = max_value_bytes
        self.retry_after_s = retry_after_s
        self.max_pending_writes = max_pending_writes
        # What background writes hold: the rows (shared with the local tier, or not) and, while a value is
        # sent, its blob. Counted as the stored bytes of each value, the blob's size.
        self.max_pending_bytes = max_pending_bytes
        self._pending_bytes = 0
        self.metrics = metrics
        metrics.shared_cache_pending_bytes.set_function(lambda: float(self._pending_bytes))
        self._resting_until = 0.0
        self._failing = False
        self._writes: set[asyncio.Task[None]] = set()
        self._write_of: dict[str, asyncio.Task[None]] = {}  # the latest write of each key, while it runs

    def key(self, content_hash: str) -> str:
        return self._prefix + content_hash

    @property
    def client(self) -> aioredis.Redis:
        """The store's client (for the leases beside the values: app/engine/cache/lease.py)."""
        return self._client

    @property
    def available(self) -> bool:
        """False while resting after a failure."""
        return time.monotonic() >= self._resting_until

    # ----- reads -----
    async def get_many(self, hashes: list[str]) -> list[CachedEmbedding | None]:
        """One round trip for all of a request's items; each unreadable value is a miss."""
        if not hashes or not self.available:
            return [None] * len(hashes)
        try:
            # decode_responses is off: values come back as bytes.
            blobs = cast(list[bytes | None], await self._client.mget([self.key(h) for h in hashes]))
        except Exception as exc:
            self.failed("get", exc)
            return [None] * len(hashes)
        self.succeeded()
        return await self.decode(hashes, blobs)

    async def decode(self, hashes: list[str], blobs: list[bytes | None]) -> list[CachedEmbedding | None]:
        """The values of ``blobs`` read for ``hashes``; an unreadable one is a miss (counted, logged)."""
        total = sum(len(blob) for blob in blobs if blob is not None)
        if total > _OFFLOAD_BYTES:
            return await in_executor(self._executor, self._decode_all, hashes, blobs)
        return self._decode_all(hashes, blobs)

    def _decode_all(self, hashes: list[str], blobs: list[bytes | None]) -> list[CachedEmbedding | None]:
        values: list[CachedEmbedding | None] = []
        for content_hash, blob in zip(hashes, blobs, strict=True):
            if blob is None:
                values.append(None)
                continue
            try:
                values.append(decode_value(blob))
            except ValueError as exc:
                # Foreign or corrupt: a miss; the encode that follows overwrites it.
                self.metrics.shared_cache_errors.labels("decode").inc()
                logger.warning("shared cache value for %s is unreadable (%s); treating it as a miss", content_hash, exc)
                values.append(None)
        return values

    # ----- writes -----
    @property
    def pending_bytes(self) -> int:
        """Bytes of the values being written in the background."""
        return self._pending_bytes

    def put(self, content_hash: str, value: CachedEmbedding) -> None:
        """Write in the background: the response never waits for the shared store."""
        if not self.available:
            return
        stored_bytes = value.rows.numel() * self.store_dtype.itemsize
        if stored_bytes > self.max_value_bytes:
            self.metrics.shared_cache_errors.labels("too_large").inc()
            return
        if len(self._writes) >= self.max_pending_writes or self._pending_bytes + stored_bytes > self.max_pending_bytes:
            self.metrics.shared_cache_errors.labels("backlog").inc()
            return
        self._pending_bytes += stored_bytes
        task = asyncio.create_task(self._write(content_hash, value), name="mmencode-shared-cache-write")
        self._writes.add(task)
        self._write_of[content_hash] = task

        def finished(task: asyncio.Task[None]) -> None:
            self._writes.discard(task)
            if self._write_of.get(content_hash) is task:
                del self._write_of[content_hash]
            self._pending_bytes -= stored_bytes

        task.add_done_callback(finished)

    async def _write(self, content_hash: str, value: CachedEmbedding) -> None:
        stored_bytes = value.rows.numel() * self.store_dtype.itemsize
        try:
            if stored_bytes > _OFFLOAD_BYTES:
                blob = await in_executor(self._executor, encode_value, value, self.store_dtype)
            else:
                blob = encode_value(value, self.store_dtype)
            await self._client.set(self.key(content_hash), blob, ex=self.ttl_s or None)
        except Exception as exc:  # a background task: nothing may escape it unlogged
            self.failed("set", exc)
            return
        self.succeeded()
        self.metrics.shared_cache_bytes_written.inc(len(blob))

    async def written(self, content_hash: str) -> None:
        """Once the write of ``content_hash`` under way (if any) has ended, stored or not."""
        task = self._write_of.get(content_hash)
        if task is not None:
            await asyncio.wait([task])

    async def flush(self) -> None:
        """Wait for the writes under way (tests, and a graceful stop)."""
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)

    async def aclose(self, grace_s: float = 2.0) -> None:
        try:
            async with asyncio.timeout(grace_s):
                await self.flush()
        except TimeoutError:
            pass
        for task in list(self._writes):
            task.cancel()
        await self._client.aclose()

    # ----- health -----
    def failed(self, op: str, exc: Exception) -> None:
        """An operation failed: counted, said once in the log, and the tier rests a while."""
        self.metrics.shared_cache_errors.labels(op).inc()
        self._resting_until = time.monotonic() + self.retry_after_s
        if not self._failing:
            self._failing = True
            logger.warning(
                "shared cache %s failed (%s: %s); serving from the local cache and the encoder, retrying every %.0fs",
                self.location,
                type(exc).__name__,
                exc,
                self.retry_after_s,
            )

    def succeeded(self) -> None:
        if self._failing:
            self._failing = False
            logger.info("shared cache %s is answering again", self.location)


def _redacted(url: str) -> str:
    """The URL without its password, for logs."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.split("@", 1)[1]
    return scheme + sep + rest
