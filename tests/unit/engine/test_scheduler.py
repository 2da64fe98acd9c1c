"""The scheduler's rules, in process: a fake adapter and a fake worker, no server, no real model.

What the rules promise a client: all-or-none precomputation (or ``fill``), metadata checked before any
file is touched, one encode for the same file twice in a request, cache hits and hash reuse, limits and
frame budgets refused before any work, and the encoder's errors located at their items.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from mmencode.app.engine.cache import LRUEmbeddingCache, TieredCache
from mmencode.app.engine.errors import (
    MissingMetadata,
    Overloaded,
    PartialPrecomputed,
    PayloadTooLarge,
    PrecomputedShapeMismatch,
    ServiceError,
    TokenCountMismatch,
    UnknownHash,
    UnsupportedModality,
)
from mmencode.app.engine.scheduler import Scheduler
from mmencode.app.engine.types import ImageItem, Item, Limits, Precomputed, VideoItem
from mmencode.app.engine.worker import QueueFull, TokenDrift
from mmencode.app.media.audio import AudioLimits
from mmencode.app.media.fetch import MediaFetcher
from mmencode.app.media.loader import MediaLoader
from mmencode.app.media.video import VideoLimits
from mmencode.app.metrics import Metrics
from mmencode.models import MetadataError, PreparedItem
from mmencode.models.base import Modality

WIDTH = 8  # the fake tower's row width


class FakeAdapter:
    """An image-only family whose rows are one per 16x16 block, and whose precomputed items must say
    ``num_patches`` (as crop-based families do)."""

    family = "fake"
    fingerprint = "fake-fingerprint"
    video_fingerprint = "none"
    hidden_size = WIDTH
    pooled_width = WIDTH
    audio_sampling_rate = None
    default_video_fps = None

    def takes(self, modality: Modality) -> bool:
        return modality == "image"

    def required_metadata_for(self, modality: Modality) -> tuple[str, ...]:
        return ("num_patches",)

    def tokens_for(self, modality: Modality, metadata: Mapping[str, Any]) -> int:
        if "num_patches" not in metadata:
            raise MetadataError("num_patches", "is required", missing=True)
        if not isinstance(metadata["num_patches"], int) or metadata["num_patches"] < 1:
            raise MetadataError("num_patches", "must be a positive integer", missing=False)
        return int(metadata["num_patches"])

    def preprocess(self, image: Image.Image) -> PreparedItem:
        patches = max(1, (image.width // 16) * (image.height // 16))
        pixels = torch.from_numpy(np.asarray(image, dtype=np.float32)).mean()
        return PreparedItem(
            tensors={"pixel_values": pixels.expand(patches, WIDTH).clone()},
            metadata={"num_patches": patches},
            num_tokens=patches,
        )


class FakeWorker:
    """Rows are each item's pixel values; records every job it was given."""

    def __init__(self, *, full: bool = False, drift: int = 0) -> None:
        self.jobs: list[int] = []
        self.full = full
        self.drift = drift  # extra rows the "encoder" produces per item
        self.queue_depth = 0

    def reserve(self) -> contextlib.AbstractContextManager[None]:
        if self.full:
            raise QueueFull
        return contextlib.nullcontext()

    async def encode(self, items: Sequence[PreparedItem], reservation: object = None) -> list[torch.Tensor]:
        await asyncio.sleep(0)
        self.jobs.append(len(items))
        if self.drift:
            expected = [item.num_tokens for item in items]
            raise TokenDrift(expected, sum(expected) + self.drift * len(items), [n + self.drift for n in expected])
        return [item.tensors["pixel_values"].clone() for item in items]


LIMITS = Limits(
    max_items=4,
    max_image_bytes=100_000,
    max_image_pixels=10**6,
    max_embedding_bytes=1 << 20,
    request_timeout=30,
    max_video_bytes=200_000,
    video=VideoLimits(max_seconds=60, max_frames=3, max_frame_pixels=10**6, max_decoded_bytes=1 << 24),
    max_video_tokens=1000,
    max_audio_bytes=1000,
    audio=AudioLimits(max_seconds=30),
)


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=2) as executor:
        yield executor


def scheduler(pool: ThreadPoolExecutor, worker: FakeWorker | None = None, cache_bytes: int = 1 << 20) -> Scheduler:
    metrics = Metrics()
    media = MediaLoader(
        MediaFetcher(timeout=1, max_redirects=0, max_bytes=LIMITS.max_image_bytes),
        max_bytes={"image": LIMITS.max_image_bytes, "video": LIMITS.max_video_bytes, "audio": LIMITS.max_audio_bytes},
        max_frames=LIMITS.video.max_frames,
        pool=pool,
    )
    return Scheduler(
        FakeAdapter(),  # type: ignore[arg-type]
        worker or FakeWorker(),  # type: ignore[arg-type]
        TieredCache([LRUEmbeddingCache(cache_bytes)], metrics),
        media,
        pool,
        LIMITS,
        metrics,
    )


def png(width: int, height: int, shade: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (shade, shade, shade)).save(buffer, "PNG")
    return buffer.getvalue()


def data_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def precomputed(rows: int, metadata: Mapping[str, Any] | None = None) -> ImageItem:
    values = np.arange(rows * WIDTH, dtype="<f4").reshape(rows, WIDTH)
    embedding = Precomputed(base64.b64encode(values.tobytes()).decode(), "float32", (rows, WIDTH))
    return ImageItem(embedding=embedding, metadata=metadata if metadata is not None else {"num_patches": rows})


def raises(error: type[ServiceError], work: Any) -> ServiceError:
    with pytest.raises(error) as caught:
        asyncio.run(work)
    return caught.value


# ----- all-or-none -----
def test_a_mixed_request_names_the_items_missing_an_embedding_before_any_work(pool: ThreadPoolExecutor) -> None:
    worker = FakeWorker()
    items: list[Item] = [precomputed(4), ImageItem(file=data_uri(png(32, 32, 10))), precomputed(2)]
    error = raises(PartialPrecomputed, scheduler(pool, worker).encode(items))
    assert error.details == {"precomputed": [0, 2], "missing": [1]}
    assert error.location is not None and error.location.index == 1
    assert worker.jobs == []


def test_fill_encodes_only_the_items_without_an_embedding(pool: ThreadPoolExecutor) -> None:
    worker = FakeWorker()
    items: list[Item] = [precomputed(4), ImageItem(file=data_uri(png(32, 48, 10)))]
    results = asyncio.run(scheduler(pool, worker).encode(items, "fill"))
    assert [r.source for r in results] == ["precomputed", "encoder"]
    assert [r.num_tokens for r in results] == [4, 6]
    assert worker.jobs == [1]
    assert torch.equal(results[0].rows, torch.arange(32, dtype=torch.float32).reshape(4, WIDTH))


def test_every_item_precomputed_needs_no_encoder(pool: ThreadPoolExecutor) -> None:
    worker = FakeWorker()
    results = asyncio.run(scheduler(pool, worker).encode([precomputed(3), precomputed(5)]))
    assert [r.source for r in results] == ["precomputed"] * 2 and worker.jobs == []


# ----- metadata and shapes of precomputed items -----
def test_a_precomputed_item_without_its_metadata_is_refused_with_the_field_named(pool: ThreadPoolExecutor) -> None:
    error = raises(MissingMetadata, scheduler(pool).encode([precomputed(3), precomputed(2, metadata={})]))
    assert error.location is not None and (error.location.index, error.location.field) == (
        1,
        ("metadata", "num_patches"),
    )
    assert error.details is not None and error.details["required"] == ["num_patches"]


def test_a_precomputed_shape_that_disagrees_with_its_metadata_is_refused(pool: ThreadPoolExecutor) -> None:
    error = raises(PrecomputedShapeMismatch, scheduler(pool).encode([precomputed(3, {"num_patches": 5})]))
    assert error.details == {"items": [{"index": 0, "expected": [5, WIDTH], "given": [3, WIDTH]}]}


# ----- one encode per file, the cache, hashes -----
def test_the_same_file_twice_in_a_request_is_encoded_once(pool: ThreadPoolExecutor) -> None:
    worker = FakeWorker()
    same = data_uri(png(32, 32, 10))
    items: list[Item] = [ImageItem(file=same), ImageItem(file=png(16, 16, 99)), ImageItem(file=same)]
    results = asyncio.run(scheduler(pool, worker).encode(items))
    assert worker.jobs == [2]  # one job: the two distinct files
    assert results[0].hash == results[2].hash != results[1].hash
    assert torch.equal(results[0].rows, results[2].rows)


def test_a_repeat_is_a_cache_hit_and_its_hash_names_the_rows_later(pool: ThreadPoolExecutor) -> None:
    worker = FakeWorker()
    engine = scheduler(pool, worker)
    file = png(32, 32, 10)
    first = asyncio.run(engine.encode([ImageItem(file=file)]))[0]
    again = asyncio.run(engine.encode([ImageItem(file=data_uri(file))]))[0]  # the same bytes, sent otherwise
    by_hash = asyncio.run(engine.encode([ImageItem(hash=first.hash)]))[0]
    assert (first.source, again.source, by_hash.source) == ("encoder", "cache", "cache")
    assert worker.jobs == [1]
    assert first.hash == again.hash == by_hash.hash
    assert torch.equal(by_hash.rows, first.rows) and by_hash.metadata == first.metadata


def test_an_unknown_hash_is_refused_at_its_item(pool: ThreadPoolExecutor) -> None:
    error = raises(UnknownHash, scheduler(pool).encode([ImageItem(file=png(16, 16, 1)), ImageItem(hash="f" * 32)]))
    assert error.location is not None and (error.location.index, error.location.field) == (1, ("hash",))


# ----- limits, refused before any work -----
def test_too_many_items_are_refused_before_anything_is_decoded(pool: ThreadPoolExecutor) -> None:
    worker = FakeWorker()
    items: list[Item] = [ImageItem(file=b"not even an image")] * (LIMITS.max_items + 1)
    error = raises(PayloadTooLarge, scheduler(pool, worker).encode(items))
    assert error.details is not None and error.details["limit"] == "max_items_per_request"
    assert "--max-items-per-request" in error.message
    assert worker.jobs == []


def test_a_file_over_its_byte_limit_names_the_flag_and_its_item(pool: ThreadPoolExecutor) -> None:
    big = np.random.default_rng(0).integers(0, 256, (400, 400, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(big).save(buffer, "PNG")
    assert len(buffer.getvalue()) > LIMITS.max_image_bytes
    for source in (buffer.getvalue(), data_uri(buffer.getvalue())):
        error = raises(
            PayloadTooLarge, scheduler(pool).encode([ImageItem(file=png(16, 16, 1)), ImageItem(file=source)])
        )
        assert "--max-image-bytes" in error.message
        assert error.location is not None and (error.location.index, error.location.field) == (1, ("image",))


def test_a_modality_the_model_does_not_take_is_refused_before_any_work(pool: ThreadPoolExecutor) -> None:
    worker = FakeWorker()
    error = raises(UnsupportedModality, scheduler(pool, worker).encode([VideoItem(file=b"\x00" * 100)]))
    assert "fake checkpoint takes no video" in error.message and worker.jobs == []


# ----- frame lists: the video's budgets -----
def test_a_frame_list_longer_than_the_frame_budget_is_refused(pool: ThreadPoolExecutor) -> None:
    frames = [data_uri(png(16, 16, shade)) for shade in range(LIMITS.video.max_frames + 1)]
    engine = scheduler(pool)
    engine.adapter.takes = lambda modality: True  # type: ignore[method-assign]
    error = raises(PayloadTooLarge, engine.encode([VideoItem(file=frames, frames_fps=2.0)]))
    assert error.details is not None and error.details["limit"] == "max_video_frames"


def test_a_frame_lists_bytes_count_against_the_video_byte_budget(pool: ThreadPoolExecutor) -> None:
    noise = np.random.default_rng(1).integers(0, 256, (150, 150, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(noise).save(buffer, "PNG")
    frame = data_uri(buffer.getvalue())  # ~68 KB each: three pass the 200 KB of the list
    engine = scheduler(pool)
    engine.adapter.takes = lambda modality: True  # type: ignore[method-assign]
    error = raises(PayloadTooLarge, engine.encode([VideoItem(file=[frame] * 3, frames_fps=2.0)]))
    assert error.details is not None and error.details["limit"] == "max_video_bytes"


def test_a_bad_frame_is_located_in_its_list(pool: ThreadPoolExecutor) -> None:
    engine = scheduler(pool)
    engine.adapter.takes = lambda modality: True  # type: ignore[method-assign]
    frames = [data_uri(png(16, 16, 1)), "data:image/png;base64,!!!!"]
    with pytest.raises(ServiceError) as caught:
        asyncio.run(engine.encode([VideoItem(file=frames, frames_fps=2.0)]))
    location = caught.value.location
    assert location is not None and (location.index, location.field) == (0, ("video", 1))


# ----- the encoder's answers -----
def test_rows_the_encoder_did_not_predict_are_a_structured_error_per_item(pool: ThreadPoolExecutor) -> None:
    items: list[Item] = [ImageItem(file=png(32, 32, 1)), ImageItem(file=png(48, 16, 2))]
    error = raises(TokenCountMismatch, scheduler(pool, FakeWorker(drift=1)).encode(items))
    assert error.details == {
        "expected_total": 7,
        "produced_total": 9,
        "items": [{"index": 0, "expected": 4, "produced": 5}, {"index": 1, "expected": 3, "produced": 4}],
    }


def test_a_full_queue_is_overloaded_with_a_retry_hint(pool: ThreadPoolExecutor) -> None:
    error = raises(Overloaded, scheduler(pool, FakeWorker(full=True)).encode([ImageItem(file=png(16, 16, 1))]))
    assert error.status == 503 and error.headers == {"Retry-After": "1"}
