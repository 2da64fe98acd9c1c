"""vLLM's encoder-cache layout: mmencode as the producer side of ``ECExampleConnector``.

vLLM (0.34.0, ``vllm/distributed/ec_transfer/ec_connector/example_connector.py``) reads an item's
encoder output from ``<shared_storage_path>/<mm_hash>/encoder_cache.safetensors``, tensor key
``ec_cache``, on a language instance started as ``ec_consumer``. Its scheduler asks
``has_cache_item`` (the file exists) as soon as the request arrives, so the file must be complete
before mmencode answers, and must never be seen half-written: it is written to a temporary file in
the same directory and renamed into place. ``mm_hash`` is the ``uuid`` the client sends, which is
mmencode's item ``hash``.

Writing is an optimisation beside the HTTP answer: a failure is logged and counted, never turned
into a failed request. The directory holds at most ``--ec-storage-bytes`` (``ec_storage.py``: the least
recently used files go first, never one named by an answer in the last ``--ec-min-age``).

Modes follow the process umask, as any file the user downloads or copies does: under the usual 022,
folders are 0755 and files 0644, so a consumer running as another uid (another container or pod) reads
them. ``mkstemp`` alone would leave 0600; the file gets ``0666 & ~umask`` before it is renamed into place.
Whoever wants them private (077) or group-writable (002) sets the umask of the mmencode process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import Executor
from pathlib import Path

import torch
from safetensors.torch import save

from mmencode.app.engine.threads import in_executor
from mmencode.app.metrics import Metrics
from mmencode.app.peers.vllm.ec_storage import EC_CACHE_FILENAME, ECStorage
from mmencode.app.wire.encodings import TORCH_DTYPES

__all__ = ["EC_CACHE_FILENAME", "EC_CACHE_KEY", "EncoderCacheWriter"]

logger = logging.getLogger("mmencode.vllm")

EC_CACHE_KEY = "ec_cache"


class EncoderCacheWriter:
    """Writes items where vLLM's ``ECExampleConnector`` looks for them. Thread-safe; blocking I/O."""

    def __init__(
        self,
        root: Path,
        dtype: str,
        metrics: Metrics,
        *,
        executor: Executor | None = None,
        max_bytes: int = 0,
        min_age_s: float = 120.0,
    ) -> None:
        self.root = root
        self._executor = executor  # where write_all writes; None: the event loop's default executor
        self.dtype = TORCH_DTYPES[dtype]
        self.metrics = metrics
        # Read once, here (os.umask can only be read by setting it, which is not safe under threads).
        self.file_mode = 0o666 & ~_process_umask()
        self.storage = ECStorage(root, max_bytes=max_bytes, min_age_s=min_age_s, metrics=metrics)

    def path_for(self, item_hash: str) -> Path:
        return self.root / item_hash / EC_CACHE_FILENAME

    def write(self, item_hash: str, rows: torch.Tensor) -> Path | None:
        """The file holding ``rows`` for ``item_hash``, written if absent; ``None`` if it cannot be."""
        if not item_hash or "/" in item_hash or item_hash in {".", ".."}:
            # Our hashes are hex; anything else must not become a path outside the root.
            self.metrics.ec_cache_writes.labels("error").inc()
            logger.error("refusing to write the encoder cache for an unsafe hash %r", item_hash)
            return None
        target = self.path_for(item_hash)
        try:
            if target.is_file() and self.storage.name(target):
                # Same hash, same rows (the hash covers model, dtype and image): nothing to write.
                self.metrics.ec_cache_writes.labels("present").inc()
                return target
            # A tensor that owns exactly its rows, in the language model's dtype, as the file's bytes.
            blob = save({EC_CACHE_KEY: rows.detach().to(device="cpu", dtype=self.dtype).contiguous().clone()})
            admission = self.storage.admit(target, len(blob))
            if admission == "present":
                self.metrics.ec_cache_writes.labels("present").inc()
                return target
            if admission == "refused":
                return None  # counted and logged by the storage
            try:
                self._write_file(target, blob)
            except BaseException:
                self.storage.give_back(target)
                raise
            self.storage.written(target)
        except Exception as exc:
            self.metrics.ec_cache_writes.labels("error").inc()
            logger.error("could not write the encoder cache for %s to %s: %s", item_hash, target, exc)
            return None
        self.metrics.ec_cache_writes.labels("written").inc()
        return target

    def _write_file(self, target: Path, blob: bytes) -> None:
        """``blob`` at ``target``, whole or not at all: a temporary file renamed into place."""
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, temp_name = tempfile.mkstemp(dir=target.parent, prefix=".encoder_cache.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(blob)
            # mkstemp's 0600 would shut out a consumer running as another uid.
            os.chmod(temp_name, self.file_mode)
            os.replace(temp_name, target)  # atomic on POSIX: readers see all or nothing
        except BaseException:
            Path(temp_name).unlink(missing_ok=True)
            raise

    @contextlib.asynccontextmanager
    async def pinned(self, hashes: Sequence[str]) -> AsyncIterator[None]:
        """While the block runs, the files of ``hashes`` are never removed, by this replica or another (a
        request naming them is on its way to the consumer)."""
        self.storage.pin(hashes)
        try:
            yield
        finally:
            self.storage.unpin(hashes)

    async def open(self) -> None:
        """Count the directory (and trim it if over budget) at start; a failure is logged, as a write's is."""
        try:
            await in_executor(self._executor, self.storage.open)
        except OSError as exc:
            logger.error("encoder-cache storage %s cannot be used: %s", self.root, exc)

    async def keep_up(self) -> None:
        """Until cancelled: the storage's upkeep (pins touched, the count read, trims) every third of the minimum
        age, at most every 30 s."""
        interval = min(30.0, max(0.5, self.storage.min_age_s / 3))
        while True:
            await asyncio.sleep(interval)
            try:
                await in_executor(self._executor, self.storage.upkeep)
            except OSError as exc:
                logger.warning("encoder-cache storage %s upkeep failed: %s", self.root, exc)

    async def write_all(self, items: Sequence[tuple[str | None, torch.Tensor]]) -> list[Path | None]:
        """Write every ``(hash, rows)`` off the event loop; items without a hash get ``None``."""

        def run() -> list[Path | None]:
            return [None if item_hash is None else self.write(item_hash, rows) for item_hash, rows in items]

        return await in_executor(self._executor, run)


def _process_umask() -> int:
    """The process umask: /proc's copy where there is one (no race), else set-and-restore."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
