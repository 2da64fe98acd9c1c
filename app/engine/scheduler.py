"""The scheduler: the request rules, decided before any expensive work, and the order of the work.

The name is the design card's and the seeds' (SGLang's ``mm_schedule``): it decides what a request may
ask and schedules the rest. In order: the items' count and modalities; all-or-none precomputation and
the metadata precomputed items need (before any file is touched); precomputed shapes; then each file's
bytes (``app/media/loader.py``), content hashes and the cache; decoding and preprocessing on a thread
pool; the rest to the encoder worker (``app/engine/worker.py``). A request succeeds whole or fails
whole: the first failing item (lowest index) names the error.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch

from mmencode.app.engine.cache import CachedEmbedding, Leases, TieredCache, content_hash, scoped_key
from mmencode.app.engine.errors import (
    InternalError,
    InvalidAudio,
    InvalidImage,
    InvalidVideo,
    ItemLocation,
    MissingMetadata,
    NotReady,
    Overloaded,
    PartialPrecomputed,
    PayloadTooLarge,
    PrecomputedShapeMismatch,
    RequestTimeout,
    ServiceError,
    TokenCountMismatch,
    UnknownHash,
    UnsupportedModality,
    ValidationFailed,
)
from mmencode.app.engine.flights import Flight, Flights, Landed, Outcome
from mmencode.app.engine.precomputed import decode_precomputed
from mmencode.app.engine.types import Item, ItemResult, Limits, SamplingRule, VideoItem
from mmencode.app.engine.worker import EncoderWorker, QueueBytesFull, QueueFull, Reservation, TokenDrift, WorkerStopped
from mmencode.app.media.audio import audio_support, decode_audio
from mmencode.app.media.image import decode_image
from mmencode.app.media.kinds import KINDS
from mmencode.app.media.loader import MediaLoader
from mmencode.app.media.video import decode_frame_list, decode_video, unpack_frames, video_support
from mmencode.app.metrics import Metrics
from mmencode.models import EncoderAdapter, MetadataError, PreparedItem
from mmencode.models.base import FrameChoice, Modality, VideoSampling
from mmencode.models.errors import UnsupportedModalityError

__all__ = ["PrecomputedMode", "Scheduler"]

PrecomputedMode = Literal["strict", "fill"]


@dataclass(frozen=True, slots=True)
class ModalityRule:
    """What the scheduler needs to know of one modality, beside what the adapter knows of it."""

    decoder_problem: Callable[[], str | None]  # why this server cannot decode it (None: it can)
    article: str  # "an image": the item in a message
    not_taken: str  # what a checkpoint that does not take it does, and which do


MODALITY_RULES: dict[Modality, ModalityRule] = {
    "image": ModalityRule(lambda: None, "an image", "encodes audio only"),
    "video": ModalityRule(
        video_support,
        "a video",
        "takes no video here (videos: qwen2_vl, qwen2_5_vl, qwen3_vl and qwen3_5 checkpoints with a video "
        "processor, and torchvision)",
    ),
    "audio": ModalityRule(
        audio_support,
        "audio",
        "has no audio tower (audio: qwen2_audio, qwen2_5_omni and qwen3_omni_moe checkpoints)",
    ),
}


@dataclass(frozen=True, slots=True)
class _Pending:
    """A raw item that missed the cache: on its way to decoding and the encoder."""

    index: int
    hash: str
    key: str  # the cache key: the hash, in the request's cache scope
    data: bytes
    kind: Modality
    sampling: VideoSampling
    frames_fps: float | None  # a frame list's (its frames packed in ``data``); None for a file


class Scheduler:
    def __init__(
        self,
        adapter: EncoderAdapter,
        worker: EncoderWorker,
        cache: TieredCache,
        media: MediaLoader,
        pool: Executor,
        limits: Limits,
        metrics: Metrics,
        video_sampling: SamplingRule = "checkpoint",
        frame_choices: Mapping[SamplingRule, FrameChoice] | None = None,
    ) -> None:
        self.adapter = adapter
        self.worker = worker
        self.cache = cache
        self.media = media
        self.pool = pool
        self.limits = limits
        self.metrics = metrics
        self.video_sampling = video_sampling  # the rule of a video item that names none (--video-sampling)
        # What each rule but the checkpoint's own hands the adapter (SGLang's frame choice, from the peers).
        self.frame_choices = dict(frame_choices or {})
        # Encodes under way, by cache key: a request that misses the cache for one of them waits for it.
        self.flights = Flights()

    @property
    def pooled_width(self) -> int:
        """The leading columns of a row that a pooled vector averages (``EncoderAdapter.pooled_width``)."""
        return self.adapter.pooled_width

    async def encode(
        self, items: Sequence[Item], mode: PrecomputedMode = "strict", scope: str | None = None
    ) -> list[ItemResult]:
        """Results in request order. Past the deadline: ``timeout``, and queued work no other request waits
        for is dropped. ``scope``: the cache scope (a tenant's), whose cached rows no other scope sees."""
        try:
            async with asyncio.timeout(self.limits.request_timeout):
                return await self._encode(items, mode, scope)
        except TimeoutError:
            raise RequestTimeout(
                f"the request took longer than {self.limits.request_timeout}s",
                details={"timeout_s": self.limits.request_timeout},
            ) from None

    async def _encode(self, items: Sequence[Item], mode: PrecomputedMode, scope: str | None) -> list[ItemResult]:
        if len(items) > self.limits.max_items:
            raise PayloadTooLarge(
                f"{len(items)} items, over the limit of {self.limits.max_items} per request (--max-items-per-request)",
                location=ItemLocation(None, ()),
                details={"limit": "max_items_per_request", "max_items": self.limits.max_items, "items": len(items)},
            )
        self._check_modalities(items)
        precomputed = [i for i, item in enumerate(items) if item.embedding is not None]
        missing = [i for i, item in enumerate(items) if item.embedding is None]
        if mode == "strict" and precomputed and missing:
            raise PartialPrecomputed(
                f"items {precomputed} carry precomputed embeddings but items {missing} do not; send all or none, "
                'or set "precomputed": "fill" to encode the missing ones',
                location=ItemLocation(missing[0], ("precomputed_embedding",), named_in_message=True),
                details={"precomputed": precomputed, "missing": missing},
            )
        results: dict[int, ItemResult] = {}
        expected_rows = self._check_metadata(items, precomputed)
        for index in precomputed:
            results[index] = self._precomputed_result(index, items[index], expected_rows[index])
        for result in await self._resolve_raw(items, missing, scope):
            results[result.index] = result
        ordered = [results[i] for i in range(len(items))]
        for result in ordered:
            self.metrics.items.labels(result.source).inc()
        return ordered

    def _check_modalities(self, items: Sequence[Item]) -> None:
        """Each item's modality only for a model that takes it, on a server that decodes it: before any work."""
        for index, item in enumerate(items):
            rule = MODALITY_RULES[item.kind]
            where = ItemLocation(index, (item.kind,), named_in_message=True)
            if not self.adapter.takes(item.kind):
                raise UnsupportedModality(
                    f"item {index} is {rule.article}, but this {self.adapter.family} checkpoint {rule.not_taken}",
                    location=where,
                    details={"family": self.adapter.family, "modality": item.kind},
                )
            # A frame list is images: it needs no video decoder.
            problem = rule.decoder_problem() if isinstance(item.source, (str, bytes)) else None
            if problem is not None:
                raise UnsupportedModality(
                    f"item {index} is {rule.article}, which this server cannot decode: {problem}",
                    location=where,
                    details={"modality": item.kind},
                )

    # ----- precomputed items -----
    def _check_metadata(self, items: Sequence[Item], indices: Sequence[int]) -> dict[int, int]:
        rows: dict[int, int] = {}
        absent: list[dict[str, Any]] = []
        malformed: list[dict[str, Any]] = []
        for index in indices:
            item = items[index]
            try:
                rows[index] = self.adapter.tokens_for(item.kind, item.metadata)
            except MetadataError as exc:
                entry = {"index": index, "field": exc.field, "reason": exc.reason}
                (absent if exc.missing else malformed).append(entry)
        if absent:
            first = absent[0]
            raise MissingMetadata(
                f"item {first['index']} has a precomputed embedding but no metadata.{first['field']}, which "
                f"{self.adapter.family} models need to check its row count",
                location=ItemLocation(first["index"], ("metadata", first["field"]), named_in_message=True),
                details={
                    "family": self.adapter.family,
                    "required": list(self.adapter.required_metadata_for(items[first["index"]].kind)),
                    "items": absent,
                },
            )
        if malformed:
            first = malformed[0]
            raise ValidationFailed(
                f"metadata.{first['field']} {first['reason']}",
                location=ItemLocation(first["index"], ("metadata", first["field"])),
                details={
                    "errors": [
                        {"loc": ["items", e["index"], "metadata", e["field"]], "msg": e["reason"], "type": "metadata"}
                        for e in malformed
                    ]
                },
            )
        return rows

    def _precomputed_result(self, index: int, item: Item, expected_rows: int) -> ItemResult:
        assert item.embedding is not None
        expected = [expected_rows, self.adapter.hidden_size]
        if list(item.embedding.shape) != expected:
            raise PrecomputedShapeMismatch(
                f"precomputed embedding has shape {list(item.embedding.shape)}, "
                f"but its metadata implies {expected} on this model",
                location=ItemLocation(index, ("precomputed_embedding", "shape")),
                details={"items": [{"index": index, "expected": expected, "given": list(item.embedding.shape)}]},
            )
        rows = decode_precomputed(item.embedding, index=index, max_bytes=self.limits.max_embedding_bytes)
        return ItemResult(index, "precomputed", None, dict(item.metadata), rows)

    # ----- raw items: hash, cache, decode, encode -----
    async def _resolve_raw(self, items: Sequence[Item], indices: Sequence[int], scope: str | None) -> list[ItemResult]:
        kinds = {i: items[i].kind for i in indices}
        fetched = await _gather_in_order(indices, [self._media_bytes(i, items[i]) for i in indices], kinds)
        results: list[ItemResult] = []
        pending: list[_Pending] = []
        # The same image twice in one request is decoded and encoded once; its copies share the rows.
        first_of: dict[str, int] = {}
        copies: list[tuple[int, int]] = []  # (index, index of the first item with the same content)
        unique: list[tuple[int, bytes | None, str]] = []
        for index, data in zip(indices, fetched, strict=True):
            content = items[index].hash if data is None else content_hash(self._identity(items[index]), data)
            assert content is not None  # an item without image bytes came with a hash
            if content in first_of:
                copies.append((index, first_of[content]))
                continue
            first_of[content] = index
            unique.append((index, data, content))
        # local, then shared: one round trip
        hits = await self.cache.get_many([scoped_key(scope, content) for _, _, content in unique])
        for (index, data, content), hit in zip(unique, hits, strict=True):
            if hit is not None:
                results.append(ItemResult(index, "cache", content, dict(hit.value.metadata), hit.value.rows))
            elif data is None:
                raise UnknownHash(
                    f"hash {content!r} is not in the cache; send the image instead",
                    location=ItemLocation(index, ("hash",)),
                    details={"hash": content},
                )
            else:
                item = items[index]
                key = scoped_key(scope, content)
                if isinstance(item, VideoItem):
                    pending.append(_Pending(index, content, key, data, "video", self._sampling(item), item.frames_fps))
                else:
                    pending.append(_Pending(index, content, key, data, item.kind, VideoSampling(), None))
        if pending:
            results.extend(await self._encode_missing(pending))
        by_index = {result.index: result for result in results}
        for index, first in copies:
            original = by_index[first]
            results.append(ItemResult(index, original.source, original.hash, dict(original.metadata), original.rows))
        return results

    async def _encode_missing(self, pending: list[_Pending]) -> list[ItemResult]:
        """Rows for items the cache missed: each joins the flight already encoding its key, or the flight
        this request starts for the rest (app/engine/flights.py). An item whose flight abandoned it is asked
        for again; the lowest index whose item failed names the error, in this request's terms."""
        results: list[ItemResult] = []
        while pending:
            waits: list[tuple[_Pending, Flight]] = []
            mine: list[_Pending] = []
            for entry in pending:
                flight = self.flights.get(entry.key)
                if flight is not None:
                    waits.append((entry, flight))
                    continue
                # A flight that landed since this request's lookup has filled the cache (before it left
                # the table: both happen on this event loop).
                cached = self.cache.peek_local(entry.key)
                if cached is not None:
                    results.append(ItemResult(entry.index, "cache", entry.hash, dict(cached.metadata), cached.rows))
                else:
                    mine.append(entry)
            own = None
            if mine:
                own = self.flights.start({entry.key: entry.index for entry in mine}, self._encode_group(mine))
                waits.extend((entry, own) for entry in mine)
            # Nothing to wait for when every item's flight landed while this request asked the shared store.
            await self.flights.wait(flight for _, flight in waits)
            retry: list[_Pending] = []
            failures: list[tuple[int, BaseException]] = []
            for entry, flight in waits:
                outcome = flight.outcome(entry.key)
                if outcome is None:
                    retry.append(entry)
                elif isinstance(outcome, Landed):
                    if flight is not own:
                        self.metrics.inflight_coalesced.inc()
                    # Encoded for this request: by its own flight, here (not another request's, another replica's).
                    source: Literal["encoder", "cache"] = "encoder" if flight is own and outcome.encoded else "cache"
                    value = outcome.value
                    results.append(ItemResult(entry.index, source, entry.hash, dict(value.metadata), value.rows))
                else:
                    if flight is not own:
                        outcome = _relocated(outcome, flight.origin[entry.key], entry.index)
                    failures.append((entry.index, outcome))
            if failures:
                raise min(failures, key=lambda failure: failure[0])[1]
            pending = retry
        return results

    async def _encode_group(self, pending: list[_Pending]) -> dict[str, Outcome]:
        """A flight's work: the rows or the error of each of ``pending``'s keys. With leases across replicas
        (app/engine/cache/lease.py), only the items no other replica is encoding are encoded here; the others'
        values are awaited from the shared store, and encoded here only if they do not come."""
        leases = self.cache.leases
        if leases is None:
            return await self._encode_now(pending)
        claim = await leases.claim([entry.key for entry in pending])
        mine = set(claim.ours)
        try:
            here, elsewhere = await asyncio.gather(
                self._encode_now([entry for entry in pending if entry.key in mine]),
                self._encode_elsewhere([entry for entry in pending if entry.key not in mine], leases),
            )
        finally:
            leases.release(claim.ours)  # once their values are written: a waiter then finds them
        return {**here, **elsewhere}

    async def _encode_elsewhere(self, pending: list[_Pending], leases: Leases) -> dict[str, Outcome]:
        """The rows of items another replica is encoding, from the shared store once it has written them;
        those it leaves (it died, failed, or took longer than the wait) are encoded here."""
        if not pending:
            return {}
        found, left = await leases.wait([entry.key for entry in pending])
        outcomes: dict[str, Outcome] = {}
        for entry in pending:
            value = found.get(entry.key)
            if value is not None:
                self.cache.keep_local(entry.key, value)
                outcomes[entry.key] = Landed(value, encoded=False)
        try:
            outcomes.update(await self._encode_now([entry for entry in pending if entry.key in set(left)]))
        finally:
            leases.release(left)
        return outcomes

    async def _encode_now(self, pending: list[_Pending]) -> dict[str, Outcome]:
        """Decode, preprocess and encode ``pending`` here as one job, and fill the cache. An item that fails
        to decode or preprocess fails its key and leaves the others unanswered (abandoned: their request fails
        on the failed item, whoever else waits for them asks again)."""
        if not pending:
            return {}
        loop = asyncio.get_running_loop()
        try:
            # Admitted, or refused, before any decoding: an overloaded service spends no CPU on a 503.
            with self._reserve() as reservation:
                prepared = await asyncio.gather(
                    *[loop.run_in_executor(self.pool, self._prepare, entry) for entry in pending],
                    return_exceptions=True,
                )
                failed: dict[str, Outcome] = {}
                for entry, outcome in zip(pending, prepared, strict=True):
                    if isinstance(outcome, ServiceError):
                        failed[entry.key] = outcome.at_item(entry.index, (entry.kind,))
                    elif isinstance(outcome, BaseException):
                        failed[entry.key] = outcome
                if failed:
                    return failed
                ready = [item for item in prepared if isinstance(item, PreparedItem)]
                rows = await self._run_encoder(ready, [entry.index for entry in pending], reservation)
        except Exception as exc:  # the job's own error (overloaded, not ready, drift): every key shares it
            return dict.fromkeys((entry.key for entry in pending), exc)
        answers: dict[str, Outcome] = {}
        for entry, item, item_rows in zip(pending, ready, rows, strict=True):
            value = CachedEmbedding(item_rows, item.metadata)
            self.cache.put(entry.key, value)
            answers[entry.key] = Landed(value, encoded=True)
        return answers

    def _identity(self, item: Item) -> str:
        """What a content hash covers beside the file's bytes: the model, and for a video the video
        processor's settings and the frames asked for (other frames, other rows)."""
        if isinstance(item, VideoItem):
            if item.frames_fps is not None:
                fps = item.frames_fps
                return f"{self.adapter.fingerprint};video-frames;{self.adapter.video_fingerprint};fps={fps}"
            return f"{self.adapter.fingerprint};video;{self.adapter.video_fingerprint};{self._sampling(item).key}"
        if item.kind == "audio":  # the feature extractor's settings are in the fingerprint already
            return f"{self.adapter.fingerprint};audio"
        return self.adapter.fingerprint

    def _sampling(self, item: VideoItem) -> VideoSampling:
        """The item's sampling, under the server's rule where it names none. A clip that asks for no rate
        or count under the checkpoint's rule gets the family's default rate where its processor would keep
        every frame (``default_video_fps``), named in the content hash as if asked."""
        rule = item.rule or self.video_sampling
        choice = None if rule == "checkpoint" else self.frame_choices[rule]
        fps = item.fps
        if choice is None and fps is None and item.num_frames is None:
            fps = self.adapter.default_video_fps
        return VideoSampling(fps=fps, num_frames=item.num_frames, choice=choice)

    async def _media_bytes(self, index: int, item: Item) -> bytes | None:
        """The file bytes of an item's image, video or audio; ``None`` for an item that only names a hash."""
        source = item.source
        if source is None:
            return None
        if isinstance(source, list):
            return await self.media.load_frames(source, index=index)
        return await self.media.load(source, KINDS[item.kind])

    def _prepare(self, pending: _Pending) -> PreparedItem:
        """Decode and preprocess one item; runs on the pool."""
        prepare = {"image": self._prepare_image, "video": self._prepare_video, "audio": self._prepare_audio}
        return prepare[pending.kind](pending)

    def _prepare_image(self, pending: _Pending) -> PreparedItem:
        image = decode_image(pending.data, max_pixels=self.limits.max_image_pixels)
        try:
            return self.adapter.preprocess(image)
        except ValueError as exc:  # e.g. Qwen2-VL refuses aspect ratios over 200
            raise InvalidImage(f"the model's image processor cannot take this image: {exc}") from None

    def _prepare_audio(self, pending: _Pending) -> PreparedItem:
        rate = self.adapter.audio_sampling_rate
        assert rate is not None  # _check_audio let the item through
        audio = decode_audio(pending.data, self.limits.audio, rate)
        try:
            return self.adapter.preprocess_audio(audio)
        except ValueError as exc:
            raise InvalidAudio(f"the model's feature extractor cannot take this audio: {exc}") from None

    def _prepare_video(self, pending: _Pending) -> PreparedItem:
        def keep(total_frames: int, fps: float | None) -> list[int]:
            try:
                return self.adapter.video_frames_to_keep(total_frames, fps, pending.sampling)
            except (ValueError, ArithmeticError) as exc:  # more frames asked than the clip has; 0 frames
                raise InvalidVideo(f"the model's video processor cannot sample this video: {exc}") from None

        asked = pending.sampling.num_frames
        if asked is not None and asked > self.limits.video.max_frames:  # before the processor lists them
            raise PayloadTooLarge(
                f"{asked} frames asked for, over the limit of {self.limits.video.max_frames} (--max-video-frames)",
                details={"limit": "max_video_frames", "max_frames": self.limits.video.max_frames, "frames": asked},
            )

        try:
            if pending.frames_fps is not None:
                video = decode_frame_list(
                    unpack_frames(pending.data), pending.frames_fps, self.limits.video, self.limits.max_image_pixels
                )
            else:
                video = decode_video(pending.data, self.limits.video, keep)
            prepared = self.adapter.preprocess_video(video, pending.sampling)
        except UnsupportedModalityError as exc:
            raise UnsupportedModality(str(exc), details={"modality": "video"}) from None
        except ValueError as exc:
            raise InvalidVideo(f"the model's video processor cannot take this video: {exc}") from None
        limit = self.limits.max_video_tokens
        if prepared.num_tokens > limit:
            raise PayloadTooLarge(
                f"the video yields {prepared.num_tokens} rows at this sampling, over the limit of {limit} "
                "(--max-video-tokens); ask for fewer frames (fps, num_frames) or send a smaller video",
                details={"limit": "max_video_tokens", "max_tokens": limit, "rows": prepared.num_tokens},
            )
        return prepared

    def _reserve(self) -> Reservation:
        try:
            return self.worker.reserve()
        except QueueFull:
            raise Overloaded(
                "the encoder queue is full; retry shortly",
                details={"queue_depth": self.worker.queue_depth},
                headers={"Retry-After": "1"},
            ) from None
        except WorkerStopped:
            raise NotReady("the encoder worker is not running") from None

    async def _run_encoder(
        self, prepared: list[PreparedItem], indices: list[int], reservation: Reservation
    ) -> list[torch.Tensor]:
        try:
            return await self.worker.encode(prepared, reservation)
        except WorkerStopped:
            raise NotReady("the encoder worker is not running") from None
        except QueueBytesFull as full:
            raise Overloaded(
                f"the inputs waiting for the encoder hold {full.queued_bytes} bytes; this request's "
                f"{full.job_bytes} more would pass the limit of {full.max_bytes} (--max-queue-bytes); retry shortly",
                details={"queue_bytes": full.queued_bytes, "request_bytes": full.job_bytes, "limit": "max_queue_bytes"},
                headers={"Retry-After": "1"},
            ) from None
        except TokenDrift as drift:
            per_item = [
                {
                    "index": index,
                    "expected": expected,
                    "produced": None if drift.produced is None else drift.produced[k],
                }
                for k, (index, expected) in enumerate(zip(indices, drift.expected, strict=True))
            ]
            raise TokenCountMismatch(
                f"the encoder produced {drift.produced_total} rows, but the preprocessor predicted "
                f"{sum(drift.expected)} for items {indices}; the checkpoint's processor and model configs disagree",
                details={
                    "expected_total": sum(drift.expected),
                    "produced_total": drift.produced_total,
                    "items": per_item,
                },
            ) from None
        except ServiceError:
            raise
        except Exception as exc:
            raise InternalError(f"the encoder failed on this request: {type(exc).__name__}") from exc


def _relocated(error: BaseException, origin: int, index: int) -> BaseException:
    """``error``, met at item ``origin`` of the request that started a flight, as it reads for another
    request's item ``index``: the item named by its own index, the job's row counts for that item alone."""
    if not isinstance(error, ServiceError):
        return InternalError(f"the encoder failed on this request: {type(error).__name__}")
    moved = copy.copy(error)
    moved.details = copy.deepcopy(error.details)
    moved.headers = dict(error.headers)
    if error.location is not None and error.location.index is not None:
        moved.location = replace(error.location, index=index)
    if isinstance(error, TokenCountMismatch) and error.details is not None:
        owner = next((entry for entry in error.details.get("items", []) if entry["index"] == origin), None)
        if owner is not None:
            moved = TokenCountMismatch(
                f"the encoder produced {owner['produced']} rows, but the preprocessor predicted "
                f"{owner['expected']} for item {index}; the checkpoint's processor and model configs disagree",
                details={
                    "expected_total": owner["expected"],
                    "produced_total": owner["produced"],
                    "items": [{**owner, "index": index}],
                },
            )
    return moved


async def _gather_in_order(
    indices: Sequence[int], awaitables: Sequence[Any], kinds: Mapping[int, Modality] | None = None
) -> list[Any]:
    """Await all; if any failed, raise the failure of the lowest item index, located at that item (its
    ``image`` or ``video`` field, as ``kinds`` says)."""
    outcomes = await asyncio.gather(*awaitables, return_exceptions=True)
    for index, outcome in zip(indices, outcomes, strict=True):
        if isinstance(outcome, ServiceError):
            raise outcome.at_item(index, ((kinds or {}).get(index, "image"),))
        if isinstance(outcome, BaseException):
            raise outcome
    return list(outcomes)
