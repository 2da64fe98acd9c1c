"""The one place a media source becomes its file's bytes, for every API and peer protocol.

A source is an upload (bytes), a data URI or bare base64 string, or an http(s) URL. Each kind has one
byte limit (``--max-image-bytes``, ``--max-video-bytes``, ``--max-audio-bytes``), checked before the
expensive step: an upload's length, a base64 string's decoded length before decoding, a URL's body as
it streams in. A video may also come as a list of frames already sampled: each frame is loaded as an
image, the list bounded by ``--max-video-frames`` and its bytes by ``--max-video-bytes``, and packed
into one blob (``media.video.pack_frames``) that is hashed and cached as a file's bytes are.

Failures carry no item context; the caller (the engine's scheduler, SGLang's bridge) knows which item
it was, except for a frame of a list, which is located here (``items[i].video[j]``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from concurrent.futures import Executor

from mmencode.app.engine.errors import PayloadTooLarge, ServiceError
from mmencode.app.media.fetch import MediaFetcher
from mmencode.app.media.image import decode_base64_file, decode_inline_image, is_url
from mmencode.app.media.kinds import IMAGE, MediaKind
from mmencode.app.media.video import pack_frames
from mmencode.models.base import Modality

__all__ = ["MediaLoader"]

# Base64 longer than this is decoded on the pool: SIMD base64 takes ~50 us per MB, and below that a
# thread hop (a wake-up of the loop) costs more than the decoding.
_INLINE_BASE64_CHARS = 1 << 20
# A frame list's images fetched (or base64-decoded) at once: the rest wait, so a long list of URLs
# holds a few downloads in flight, not hundreds.
_FRAME_FETCHES = 8


class MediaLoader:
    def __init__(
        self,
        fetcher: MediaFetcher,
        *,
        max_bytes: Mapping[Modality, int],
        max_frames: int,
        pool: Executor | None = None,
    ) -> None:
        self.fetcher = fetcher
        self._max_bytes = dict(max_bytes)
        self.max_frames = max_frames  # --max-video-frames: a frame list's length
        self._pool = pool  # decodes long base64; None: the event loop's default executor

    def max_bytes(self, kind: MediaKind) -> int:
        return self._max_bytes[kind.name]

    async def load(self, source: str | bytes, kind: MediaKind) -> bytes:
        """The file bytes of ``source``, meant to be ``kind``, within its byte limit."""
        max_bytes = self.max_bytes(kind)
        if isinstance(source, bytes):
            if len(source) > max_bytes:
                raise PayloadTooLarge(
                    f"{kind.name} is {len(source)} bytes, over the limit of {max_bytes} ({kind.flag})",
                    details={"limit": kind.limit, "max_bytes": max_bytes},
                )
            return source
        if is_url(source):
            return await self.fetcher.fetch(source, kind=kind, max_bytes=max_bytes)

        def decode() -> bytes:
            if kind is IMAGE:  # an image's own checks: text sent as an image, SVG...
                return decode_inline_image(source, max_bytes=max_bytes)
            return decode_base64_file(source, max_bytes=max_bytes, kind=kind)

        if len(source) < _INLINE_BASE64_CHARS:
            return decode()
        return await asyncio.get_running_loop().run_in_executor(self._pool, decode)

    async def load_frames(self, frames: list[str], *, index: int) -> bytes:
        """A frame list's images, each loaded as an image, packed into one blob. ``index``: the item's,
        to locate a failing frame (``items[index].video[j]``)."""
        if len(frames) > self.max_frames:
            raise PayloadTooLarge(
                f"the frame list holds {len(frames)} frames, over the limit of {self.max_frames} (--max-video-frames)",
                details={"limit": "max_video_frames", "max_frames": self.max_frames, "frames": len(frames)},
            )
        budget = self._max_bytes["video"]
        received = 0
        gate = asyncio.Semaphore(_FRAME_FETCHES)

        async def one(position: int, frame: str) -> bytes:
            nonlocal received
            async with gate:
                try:
                    data = await self.load(frame, IMAGE)  # each within --max-image-bytes
                except ServiceError as error:
                    raise error.at_item(index, ("video", position)) from None
            received += len(data)
            if received > budget:  # the whole list within --max-video-bytes, checked as frames arrive
                raise PayloadTooLarge(
                    f"the frame list's images pass {budget} bytes, the limit (--max-video-bytes)",
                    details={"limit": "max_video_bytes", "max_bytes": budget},
                )
            return data

        try:
            async with asyncio.TaskGroup() as group:  # the first failure cancels the frames still coming
                tasks = [group.create_task(one(position, frame)) for position, frame in enumerate(frames)]
        except BaseExceptionGroup as failed:
            raise failed.exceptions[0] from None
        return pack_frames([task.result() for task in tasks])
