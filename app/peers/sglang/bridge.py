"""SGLang's ``/encode`` answered by mmencode's engine: a language server started with ``--language-only
--encoder-urls http://mmencode`` (or that mmencode registered with) is served as by SGLang's own encoder.

Each part's items become engine items (their files through the one media loader); the rows, cast to
``--sglang-dtype``, are pushed as SGLang's frames (:mod:`.protocol`) where it waits (:mod:`.push`). On
failure an error frame is pushed too, so the language server never waits for rows that will not come.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import torch

from mmencode.app.engine.errors import InternalError, InvalidImage, ItemLocation, RequestTimeout, ServiceError
from mmencode.app.engine.types import AudioItem, ImageItem, Item, ItemResult, Source, VideoItem
from mmencode.app.media.kinds import KINDS
from mmencode.app.media.loader import MediaLoader
from mmencode.app.metrics import Metrics
from mmencode.app.peers.sglang.protocol import GRID_FIELDS, VIDEO_META, embedding_frames, error_frames
from mmencode.app.peers.sglang.push import ReceiverRegistry, ZmqPusher, endpoint_of_url, tcp_endpoint
from mmencode.app.wire.encodings import TORCH_DTYPES
from mmencode.models.base import Modality
from mmencode.schemas.sglang import SGLangEncodeRequest, SGLangReceiveUrlRequest

__all__ = ["SGLangEncoderBridge"]

logger = logging.getLogger("mmencode.sglang")


class SGLangEncoderBridge:
    """Turns SGLang's ``/encode`` into a scheduler request and pushes its result where SGLang waits."""

    def __init__(
        self,
        encode: Callable[[list[Item]], Awaitable[list[ItemResult]]],
        media: MediaLoader,
        *,
        dtype: str,
        compute_dtype: Callable[[], torch.dtype],
        push_timeout_s: float,
        metrics: Metrics,
    ) -> None:
        self._encode = encode
        self._media = media
        # "auto": the encoder's compute dtype, read once the model is loaded.
        self._dtype = None if dtype == "auto" else TORCH_DTYPES[dtype]
        self._compute_dtype = compute_dtype
        self._timeout_s = push_timeout_s
        self._metrics = metrics
        self.registry = ReceiverRegistry(ttl_s=max(600.0, 4 * push_timeout_s))
        self._pusher = ZmqPusher(push_timeout_s)
        self._background: set[asyncio.Task[None]] = set()

    def register(self, request: SGLangReceiveUrlRequest) -> None:
        self.registry.register(request.req_id, request.receive_count, request.receive_url)

    async def encode(self, request: SGLangEncodeRequest) -> list[ItemResult]:
        """Encode and push; on failure push the error frame, then raise the error for the HTTP answer."""
        try:
            results = await self._encode_items(request)
        except ServiceError as error:
            await self._push_error(request, error)
            raise
        except Exception as exc:
            logger.exception("SGLang /encode failed for %s", request.req_id)
            internal = InternalError(f"the encoder failed on this request: {type(exc).__name__}")
            await self._push_error(request, internal)
            raise internal from exc
        rows = torch.cat([r.rows for r in results]).to(self._dtype or self._compute_dtype())
        grid_field = GRID_FIELDS(request.modality)
        grids: list[Any] = [r.metadata.get(grid_field) for r in results]
        grid_dim: list[list[int]] | torch.Tensor | None = None
        if None not in grids:
            audio = request.modality.upper() == "AUDIO"
            grid_dim = torch.tensor(grids, dtype=torch.long) if audio else [list(g) for g in grids]
        video_meta = {
            attribute: [r.metadata[name] for r in results]
            for name, attribute in VIDEO_META.items()
            if all(name in r.metadata for r in results)
        }
        frames = embedding_frames(request, rows, grid_dim, video_meta)
        endpoints, expected = await self._destinations(request)
        failed = await self._push_all(endpoints, frames, kind="embedding")
        if expected is None or len(endpoints) < expected:
            raise RequestTimeout(
                f"only {len(endpoints)} of {expected or 'the'} scheduler ranks registered for {request.req_id} "
                f"within {self._timeout_s}s",
                details={"req_id": request.req_id, "registered": len(endpoints), "expected": expected},
            )
        if failed:
            raise RequestTimeout(
                f"could not push the embedding of {request.req_id} to {failed} within {self._timeout_s}s",
                details={"req_id": request.req_id, "endpoints": failed, "timeout_s": self._timeout_s},
            )
        return results

    async def _encode_items(self, request: SGLangEncodeRequest) -> list[ItemResult]:
        kind: Modality = request.modality.lower()  # type: ignore[assignment]  # the schema allows these three
        items = [await self._item(index, item, kind) for index, item in enumerate(request.items_as_dicts())]
        return await self._encode(items)

    async def _item(self, index: int, item: dict[str, Any], kind: Modality) -> Item:
        expected = item.get("content_hash")
        if expected is None:
            return _item_of(kind, item["url"])
        # SGLang's hash (sha256 of the file) names the file's bytes: load them here to check it; the engine
        # then takes the bytes as they are, and hashes them for its cache as it hashes every file.
        try:
            data = await self._media.load(item["url"], KINDS[kind])
        except ServiceError as error:
            raise error.at_item(index, (kind,)) from None
        actual = "sha256:" + hashlib.sha256(data).hexdigest()
        if actual != expected.lower():
            raise InvalidImage(
                f"content hash mismatch: expected {expected}, got {actual}",
                location=ItemLocation(index, ("hash",)),
                details={"expected": expected, "actual": actual},
            )
        return _item_of(kind, data)

    async def _destinations(self, request: SGLangEncodeRequest) -> tuple[list[str], int | None]:
        """The endpoints to push to, and how many there should be (fewer: registrations timed out)."""
        port = request.embedding_port
        if port is None:
            urls, expected = await self.registry.wait_for_all(request.req_id, self._timeout_s)
            return [endpoint_of_url(url) for url in urls], expected
        assert request.prefill_host is not None
        ports = port if isinstance(port, list) else [port]
        return [tcp_endpoint(request.prefill_host, p) for p in ports], len(ports)

    async def _push_all(self, endpoints: list[str], frames: Sequence[bytes | memoryview], *, kind: str) -> list[str]:
        """Push to every endpoint at once; the endpoints that could not be reached."""
        if not endpoints:
            self._metrics.sglang_pushes.labels(kind, "failed").inc()
            return ["<no receiver registered>"]
        outcomes = await asyncio.gather(
            *(asyncio.to_thread(self._pusher.push, endpoint, frames) for endpoint in endpoints),
            return_exceptions=True,
        )
        failed = []
        for endpoint, outcome in zip(endpoints, outcomes, strict=True):
            ok = not isinstance(outcome, BaseException)
            self._metrics.sglang_pushes.labels(kind, "ok" if ok else "failed").inc()
            if not ok:
                logger.warning("ZMQ push of %s to %s failed: %r", kind, endpoint, outcome)
                failed.append(endpoint)
        return failed

    async def _push_error(self, request: SGLangEncodeRequest, error: ServiceError) -> None:
        frames = error_frames(request, error)
        if request.embedding_port is not None:
            await self._push_all((await self._destinations(request))[0], frames, kind="error")
            return
        # zmq_to_scheduler: the ranks may register after this answer; deliver to them in the background.
        task = asyncio.create_task(self._push_error_when_registered(request, frames))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _push_error_when_registered(
        self, request: SGLangEncodeRequest, frames: Sequence[bytes | memoryview]
    ) -> None:
        await self._push_all((await self._destinations(request))[0], frames, kind="error")

    async def aclose(self) -> None:
        for task in list(self._background):
            task.cancel()
        self._pusher.close()


def _item_of(kind: Modality, file: Source) -> Item:
    """An engine item of the part's modality. A clip follows SGLang's own frame choice and sizes: SGLang's
    encoder decodes a clip itself with qwen-vl-utils' rules, and on this route mmencode is that encoder."""
    if kind == "video":
        return VideoItem(file=file, rule="sglang")
    return AudioItem(file=file) if kind == "audio" else ImageItem(file=file)
