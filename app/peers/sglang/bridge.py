"""SGLang's encoder-server protocol (sglang 0.5.23): mmencode answers a language server started with
``--language-only --encoder-urls http://mmencode`` as SGLang's own encoder server would.

The language server ``POST``s ``/encode`` with the images of one part of a request; the encoder pushes
the result over ZMQ (``sglang/srt/disaggregation/encoder/server.py: MMEncoder._send``):

- frame 0: a pickled ``sglang.srt.disaggregation.encoder.receiver.EmbeddingData`` without its
  embedding (``copy_without_embedding``), read with SGLang's ``safe_pickle_loads`` allow-list;
- frame 1: the rows' raw bytes, read with ``torch.frombuffer(buf, dtype=obj.dtype).reshape(obj.shape)``.

A failure is one frame: the ``EmbeddingData`` with ``error_msg``/``error_code`` set, and ``/encode``
answers non-200. Where to push follows from ``embedding_port``: an int (``zmq_to_tokenizer``) or a
list of ints (``zmq_to_scheduler`` with ports) on ``prefill_host``; ``None`` (``zmq_to_scheduler``):
every ``host:port`` the scheduler ranks register through ``/scheduler_receive_url``, which may arrive
before or after ``/encode``.

mmencode never imports sglang (a multi-GB install): frame 0 is written from stand-in classes whose
pickled class paths are SGLang's, by a pickler that names them without importing them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import logging
import pickle
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import zmq

from mmencode.app.engine.errors import (
    InternalError,
    InvalidImage,
    InvalidRequest,
    ItemLocation,
    RequestTimeout,
    ServiceError,
)
from mmencode.app.engine.scheduler import ItemInput, ItemResult
from mmencode.app.http.locators import ErrorLocator
from mmencode.app.media.audio import AUDIO
from mmencode.app.media.fetch import ImageFetcher
from mmencode.app.media.image import decode_base64_file, decode_inline_image, is_url
from mmencode.app.media.video import VIDEO
from mmencode.app.metrics import Metrics
from mmencode.app.wire.encodings import TORCH_DTYPES
from mmencode.schemas.sglang import SGLangEncodeRequest, SGLangReceiveUrlRequest

__all__ = [
    "EMBEDDING_DATA_CLASS",
    "MODALITY_CLASS",
    "SGLANG_LOCATOR",
    "ReceiverRegistry",
    "SGLangEncoderBridge",
    "embedding_frames",
]

# SGLang's names: the request's `mm_items[i]`, whose image or video is its `url` and whose hash its `content_hash`.
SGLANG_LOCATOR = ErrorLocator(
    "mm_items", "mm_items[{index}]", {"image": "url", "video": "url", "audio": "url", "hash": "content_hash"}
)

logger = logging.getLogger("mmencode.sglang")

EMBEDDING_DATA_CLASS = ("sglang.srt.disaggregation.encoder.receiver", "EmbeddingData")
MODALITY_CLASS = ("sglang.srt.multimodal.modality", "Modality")
# sglang.srt.multimodal.modality.Modality's values, and the item metadata SGLang's receiver takes as the
# part's grid (``grid_dim``) for each: the grids of images and clips; for audio, each clip's mel frame
# count (SGLang's ``audio_feature_lens_raw``, a LongTensor its receiver flattens into ``audio_feature_lens``).
_MODALITIES = {"IMAGE": (1, "image_grid_thw"), "VIDEO": (2, "video_grid_thw"), "AUDIO": (3, "audio_feature_length")}
# Per-item video metadata SGLang's encoder sends beside a VIDEO part (receiver.py's
# _GENERAL_VIDEO_META_ATTRS), one entry per clip; its receiver chains each part's list into the model's
# inputs. mmencode's metadata name -> SGLang's attribute: Qwen2.5-VL's seconds per temporal patch, and
# Qwen3-VL's and Qwen3.5's per-patch timestamps (vLLM's `timestamps`).
_VIDEO_META = {"second_per_grid_ts": "second_per_grid_ts", "timestamps": "video_timestamps"}


# ----- frame 0: SGLang's EmbeddingData, pickled without SGLang -----
class _EmbeddingData:
    """Carries the attributes of SGLang's ``EmbeddingData``; pickled under SGLang's class path."""

    def __init__(self, **attributes: Any) -> None:
        self.__dict__.update(attributes)


class _Modality:
    """Pickles as ``Modality(value)``, which the unpickler turns into SGLang's enum member."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return _Modality, (self.value,)


_PEER_CLASSES: dict[type, tuple[str, str]] = {_EmbeddingData: EMBEDDING_DATA_CLASS, _Modality: MODALITY_CLASS}


class _PeerPickler(pickle._Pickler):
    """The standard pickler, except that the stand-ins are written under SGLang's class paths.

    The standard ``save_global`` imports a class's module to check the name; SGLang's module is not
    installed here, so for the stand-ins the same opcodes are written without the check.
    """

    def save_global(self, obj: Any, name: str | None = None) -> None:
        path = _PEER_CLASSES.get(obj) if isinstance(obj, type) else None
        if path is None:
            super().save_global(obj, name)  # type: ignore[misc]
            return
        module, qualname = path
        self.save(module)  # type: ignore[attr-defined]
        self.save(qualname)  # type: ignore[attr-defined]
        self.write(pickle.STACK_GLOBAL)  # type: ignore[attr-defined]
        self.memoize(obj)  # type: ignore[attr-defined]


def _pickle(obj: object) -> bytes:
    buffer = io.BytesIO()
    _PeerPickler(buffer, protocol=4).dump(obj)
    return buffer.getvalue()


def _embedding_data(
    request: SGLangEncodeRequest,
    *,
    grid_dim: list[list[int]] | torch.Tensor | None = None,
    dtype: torch.dtype | None = None,
    shape: list[int] | None = None,
    error_msg: str | None = None,
    error_code: int | None = None,
    video_meta: dict[str, list[Any]] | None = None,
) -> _EmbeddingData:
    # Exactly the attributes of SGLang's EmbeddingData.copy_without_embedding(), in its order; then the
    # video metadata its encoder adds as keyword attributes.
    return _EmbeddingData(
        req_id=request.req_id,
        num_parts=request.num_parts,
        part_idx=request.part_idx,
        grid_dim=grid_dim,
        modality=_Modality(_MODALITIES[request.modality.upper()][0]),
        embedding=None,
        send_time=None,
        dtype=dtype,
        shape=shape,
        _mr_ptr=None,
        error_msg=error_msg,
        error_code=error_code,
        **(video_meta or {}),
    )


def embedding_frames(
    request: SGLangEncodeRequest,
    rows: torch.Tensor,
    grid_dim: list[list[int]] | torch.Tensor | None,
    video_meta: dict[str, list[Any]] | None = None,
) -> list[bytes | memoryview]:
    """The two frames of a successful part: pickled metadata, then the rows' native bytes."""
    rows = rows.contiguous()
    header = _pickle(
        _embedding_data(request, grid_dim=grid_dim, dtype=rows.dtype, shape=list(rows.shape), video_meta=video_meta)
    )
    return [header, rows.view(torch.uint8).numpy().tobytes()]


def error_frames(request: SGLangEncodeRequest, error: ServiceError) -> list[bytes | memoryview]:
    """The single frame of a failed part: ``error_code`` is the HTTP status mmencode answers with."""
    message = f"{error.code}: {SGLANG_LOCATOR.message(error)}"
    return [_pickle(_embedding_data(request, error_msg=message, error_code=error.status))]


def _item_of(kind: str, source: str | bytes) -> ItemInput:
    """An item of the part's modality (``image``, ``video`` or ``audio``)."""
    if kind == "video":
        return ItemInput(video=source)
    return ItemInput(audio=source) if kind == "audio" else ItemInput(image=source)


# ----- where to push -----
@dataclass
class _Registration:
    receive_count: int | None  # None until the first rank registers
    urls: set[str] = field(default_factory=set)
    created: float = field(default_factory=time.monotonic)
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class ReceiverRegistry:
    """``/scheduler_receive_url`` registrations by part id; one may come before its ``/encode``."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._entries: dict[str, _Registration] = {}

    def register(self, req_id: str, receive_count: int, url: str) -> None:
        self._expire()
        entry = self._entries.setdefault(req_id, _Registration(receive_count))
        if entry.receive_count is None:  # /encode came first and is waiting
            entry.receive_count = receive_count
        if entry.receive_count != receive_count:
            raise InvalidRequest(
                f"inconsistent receive_count for req_id={req_id}: registered {entry.receive_count}, "
                f"got {receive_count}",
                param="receive_count",
                details={"req_id": req_id, "registered": entry.receive_count, "given": receive_count},
            )
        entry.urls.add(url)
        entry.changed.set()

    async def wait_for_all(self, req_id: str, timeout_s: float) -> tuple[list[str], int | None]:
        """The URLs once ``receive_count`` have registered, or what has at the deadline; and the count."""
        entry = self._entries.setdefault(req_id, _Registration(receive_count=None))
        deadline = time.monotonic() + timeout_s
        try:
            while entry.receive_count is None or len(entry.urls) < entry.receive_count:
                entry.changed.clear()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(entry.changed.wait(), remaining)
            return sorted(entry.urls), entry.receive_count
        finally:
            self._entries.pop(req_id, None)

    def _expire(self) -> None:
        cutoff = time.monotonic() - self.ttl_s
        for req_id in [k for k, v in self._entries.items() if v.created < cutoff]:
            del self._entries[req_id]


def _tcp_endpoint(host: str, port: int) -> str:
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # IPv6
    return f"tcp://{host}:{port}"


def _endpoint_of_url(url: str) -> str:
    host, _, port = url.rpartition(":")
    return _tcp_endpoint(host.strip("[]"), int(port))


class ZmqPusher:
    """One PUSH socket per message, bounded in time: a language server that is gone never blocks."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_ms = int(timeout_s * 1000)
        self._context = zmq.Context()

    def push(self, endpoint: str, frames: Sequence[bytes | memoryview]) -> None:
        """Blocking; raises ``zmq.Again`` when the peer does not take the message in time."""
        sock = self._context.socket(zmq.PUSH)
        try:
            # IMMEDIATE: queue only to a connected peer, so an absent one times out instead of
            # holding the message forever; SNDTIMEO bounds that wait.
            sock.setsockopt(zmq.IMMEDIATE, 1)
            sock.setsockopt(zmq.SNDTIMEO, self.timeout_ms)
            if endpoint.startswith("tcp://["):
                sock.setsockopt(zmq.IPV6, 1)
            sock.connect(endpoint)
            tracker = sock.send_multipart(list(frames), copy=False, track=True)
            if tracker is not None:
                tracker.wait(self.timeout_ms / 1000)
        finally:
            # Lingering lets the I/O thread finish delivering what was queued, for at most the timeout.
            sock.close(linger=self.timeout_ms)

    def close(self) -> None:
        self._context.destroy(linger=0)


# ----- the bridge the routes call -----
class SGLangEncoderBridge:
    """Turns SGLang's ``/encode`` into a scheduler request and pushes its result where SGLang waits."""

    def __init__(
        self,
        encode: Callable[[list[ItemInput]], Awaitable[list[ItemResult]]],
        fetcher: ImageFetcher,
        *,
        max_image_bytes: int,
        max_video_bytes: int,
        max_audio_bytes: int,
        dtype: str,
        push_timeout_s: float,
        metrics: Metrics,
    ) -> None:
        self._encode = encode
        self._fetcher = fetcher
        self._max_image_bytes = max_image_bytes
        self._max_video_bytes = max_video_bytes
        self._max_audio_bytes = max_audio_bytes
        self._dtype = TORCH_DTYPES[dtype]
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
        rows = torch.cat([r.rows for r in results]).to(self._dtype)
        grid_field = _MODALITIES[request.modality.upper()][1]
        grids: list[Any] = [r.metadata.get(grid_field) for r in results]
        grid_dim: list[list[int]] | torch.Tensor | None = None
        if None not in grids:
            audio = request.modality.upper() == "AUDIO"
            grid_dim = torch.tensor(grids, dtype=torch.long) if audio else [list(g) for g in grids]
        video_meta = {
            attribute: [r.metadata[name] for r in results]
            for name, attribute in _VIDEO_META.items()
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
        kind = request.modality.lower()
        items = [await self._item(index, item, kind) for index, item in enumerate(request.items_as_dicts())]
        return await self._encode(items)

    async def _item(self, index: int, item: dict[str, Any], kind: str) -> ItemInput:
        expected = item.get("content_hash")
        if expected is None:
            return _item_of(kind, item["url"])
        # The hash names the file's bytes: fetch or decode them here to check it.
        url = item["url"]
        try:
            if kind != "image":
                data = await self._media_bytes(url, kind)
            elif is_url(url):
                data = await self._fetcher.fetch(url)
            else:
                data = decode_inline_image(url, max_bytes=self._max_image_bytes)
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

    async def _media_bytes(self, url: str, kind: str) -> bytes:
        media, max_bytes = (VIDEO, self._max_video_bytes) if kind == "video" else (AUDIO, self._max_audio_bytes)
        if is_url(url):
            return await self._fetcher.fetch(url, kind=media, max_bytes=max_bytes)
        return decode_base64_file(url, max_bytes=max_bytes, kind=media)

    async def _destinations(self, request: SGLangEncodeRequest) -> tuple[list[str], int | None]:
        """The endpoints to push to, and how many there should be (fewer: registrations timed out)."""
        port = request.embedding_port
        if port is None:
            urls, expected = await self.registry.wait_for_all(request.req_id, self._timeout_s)
            return [_endpoint_of_url(url) for url in urls], expected
        assert request.prefill_host is not None
        ports = port if isinstance(port, list) else [port]
        return [_tcp_endpoint(request.prefill_host, p) for p in ports], len(ports)

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
