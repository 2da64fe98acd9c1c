"""The chat front door's work: encode a chat request's images here, forward it upstream with their rows.

Images go through the scheduler exactly as ``/v1/encode``'s do (the same cache, batching across
requests, limits, URL rules and errors), so a bad image is refused before any upstream sees the
request. Each image part is then replaced by the part the transport calls for
(:mod:`app.peers.vllm.parts`); with the ``ec`` transport the connector files are written first,
and a request whose files could not all be written is never sent (a part naming a missing file kills
vLLM's engine). With the ``mooncake`` transport the rows are pushed into the chosen upstream's own
consumer once it is chosen, and the request names each pushed item in ``ec_transfer_params``; one whose
push did not complete is never sent (the consumer would wait for rows that never come, then fail it).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from typing import Literal

import orjson
import torch

from mmencode.app.api.chat.errors import EncoderCacheWriteFailed, UpstreamFailed
from mmencode.app.api.chat.forward import BodyFor, NotSent, Prepared, UpstreamAnswer, UpstreamForwarder
from mmencode.app.api.chat.front_door import FrontDoor
from mmencode.app.api.chat.request import ChatRequest, media_parts_left
from mmencode.app.api.chat.upstreams import Upstream, UpstreamPool
from mmencode.app.config import Settings
from mmencode.app.engine.engine import Engine, EngineInfo
from mmencode.app.engine.errors import ServiceError, UnsupportedParameter
from mmencode.app.engine.threads import in_executor
from mmencode.app.engine.types import ImageItem, ItemResult
from mmencode.app.http.errors import error_object
from mmencode.app.metrics import Metrics
from mmencode.app.peers.vllm.ec_writer import EncoderCacheWriter
from mmencode.app.peers.vllm.families import EMBEDS_REFUSED
from mmencode.app.peers.vllm.mooncake.errors import EncoderCachePushFailed
from mmencode.app.peers.vllm.mooncake.push import MooncakePusher, Transfer
from mmencode.app.peers.vllm.parts import ec_part, embeds_part
from mmencode.app.wire.encodings import TORCH_DTYPES
from mmencode.models import CheckpointError

__all__ = ["ChatOutcome", "ChatService", "ChatStream"]

logger = logging.getLogger("mmencode.upstream")

Transport = Literal["embeds", "ec", "mooncake"]
# Requests whose rows are past this are serialised on a thread: a 40 MB body must not stall the loop.
_OFFLOAD_BYTES = 1 << 20


@dataclass
class ChatOutcome:
    """What a chat request did, for its access line: the upstreams asked, the rows its images became."""

    upstreams: list[str] = field(default_factory=list)
    tokens: int | None = None


@dataclass
class ChatStream:
    """A started streamed answer: the upstream's bytes as they come, then the upstream released."""

    upstream: str
    media_type: str
    _answer: UpstreamAnswer
    _started: float
    _metrics: Metrics

    async def body(self) -> AsyncIterator[bytes]:
        try:
            yield self._answer.first
            async for chunk in self._answer.rest():
                yield chunk
        except ServiceError as exc:
            yield _sse_error(exc)
        except Exception as exc:  # the upstream went away mid-stream: too late for a status, say it in-stream
            logger.warning("upstream %s failed mid-stream: %s: %s", self.upstream, type(exc).__name__, exc)
            yield _sse_error(UpstreamFailed(f"upstream {self.upstream} failed mid-answer: {type(exc).__name__}"))
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Release the upstream (idempotent); closing early cancels the upstream's request."""
        if self._started:
            self._metrics.chat_stage_seconds.labels("total").observe(time.perf_counter() - self._started)
            self._started = 0.0
        await self._answer.aclose()


class ChatService:
    @classmethod
    def start(
        cls,
        engine: Engine,
        front_door: FrontDoor,
        metrics: Metrics,
        *,
        settings: Settings,
        ec_writer: EncoderCacheWriter | None,
        pusher: MooncakePusher | None = None,
    ) -> ChatService:
        """The chat API's service, and its check of the loaded model: the front door's transport must be one
        vLLM takes this family's rows through, or the service does not start (a checkpoint error)."""
        service = cls(
            engine,
            front_door.pool,
            front_door.forwarder,
            metrics,
            transport=settings.upstream_transport,
            dtype=settings.upstream_dtype,
            ec_writer=ec_writer,
            pusher=pusher,
            # --upstream-ec-control lists the consumers in --upstream's order.
            consumers=dict(zip(settings.upstream, settings.upstream_ec_control, strict=False)),
            executor=engine.io_executor,
        )
        engine.startup_checks.append(service.check_transport)
        return service

    def __init__(
        self,
        engine: Engine,
        pool: UpstreamPool,
        forwarder: UpstreamForwarder,
        metrics: Metrics,
        *,
        transport: Transport,
        dtype: str,
        ec_writer: EncoderCacheWriter | None,
        pusher: MooncakePusher | None = None,
        consumers: Mapping[str, str] | None = None,
        executor: Executor | None = None,
    ) -> None:
        self._engine = engine
        self._pool = pool
        self._forwarder = forwarder
        self._metrics = metrics
        self._transport = transport
        self._dtype = dtype  # "auto": the encoder's compute dtype
        self._ec_writer = ec_writer
        self._executor = executor
        self._pusher = pusher
        self._consumers = dict(consumers or {})  # upstream URL -> its consumer's control address
        if transport == "ec" and ec_writer is None:
            raise ValueError("the ec transport needs an encoder-cache writer (--ec-shared-storage)")
        consumers_known = set(self._consumers) == {u.url for u in pool.upstreams}
        if transport == "mooncake" and (pusher is None or not consumers_known):
            raise ValueError("the mooncake transport needs a pusher and each upstream's --upstream-ec-control")

    @property
    def pool(self) -> UpstreamPool:
        return self._pool

    def _aliased(self, chat: ChatRequest) -> ChatRequest:
        """The encoder's own id (what /v1/models showed a client before the front door listed the upstreams')
        names the upstreams' model when they serve exactly one: the request goes there, under that name."""
        if chat.model != self._engine.model_name:
            return chat
        served = self._pool.models()
        if len(served) != 1:
            return chat  # none known yet, or several: the id names no chat model (404 with the list)
        chat.body["model"] = served[0]
        return replace(chat, model=served[0])

    def check_transport(self, info: EngineInfo) -> None:
        """vLLM refuses ``image_embeds`` parts for some families: those need the connector files."""
        if self._transport == "embeds" and info.family in EMBEDS_REFUSED:
            raise CheckpointError(
                f"vLLM takes no image_embeds part for {info.family} models, so the front door cannot forward "
                "their rows inside the request: start with --upstream-transport ec and --ec-shared-storage DIR "
                "(the directory the upstreams' ECExampleConnector reads)"
            )

    async def complete(
        self, chat: ChatRequest, *, outcome: ChatOutcome | None = None, scope: str | None = None
    ) -> tuple[str, bytes]:
        """A whole answer: ``(media type, body)``. ``outcome``: what the request did, filled in as it goes;
        ``scope``: the request's cache scope (its tenant's)."""
        started = time.perf_counter()
        answer = await self._open(chat, outcome or ChatOutcome(), scope)
        try:
            return answer.media_type, answer.first
        finally:
            await answer.aclose()
            self._metrics.chat_stage_seconds.labels("total").observe(time.perf_counter() - started)

    async def stream(
        self, chat: ChatRequest, *, outcome: ChatOutcome | None = None, scope: str | None = None
    ) -> ChatStream:
        """A streamed answer whose upstream has already sent its success status and first bytes."""
        started = time.perf_counter()
        answer = await self._open(chat, outcome or ChatOutcome(), scope)
        return ChatStream(answer.upstream.url, answer.media_type, answer, started, self._metrics)

    async def _open(self, chat: ChatRequest, outcome: ChatOutcome, scope: str | None) -> UpstreamAnswer:
        chat = self._aliased(chat)
        # Refuse a model no upstream serves, or none available, before spending the encoder on it.
        self._pool.require(chat.model)
        if self._transport == "mooncake":
            _check_pushable(chat)
        hashes: list[str] = []
        if chat.images:
            encode_started = time.perf_counter()
            results = await self._encode(chat, scope)
            self._metrics.chat_stage_seconds.labels("encode").observe(time.perf_counter() - encode_started)
            hashes = [result.hash for result in results if result.hash is not None]
            outcome.tokens = sum(result.num_tokens for result in results)
            body = await self._rewritten(chat, results)
        else:
            body = orjson.dumps(chat.body)
        # The connector files stay until the upstream has answered (it has read them by then), however long
        # it takes: none is removed to make room meanwhile, by this replica or another.
        writer = self._ec_writer if self._transport == "ec" else None
        async with writer.pinned(hashes) if writer is not None else contextlib.nullcontext():
            answer = await self._forwarder.open(
                body, model=chat.model, hashes=hashes, stream=chat.stream, tried=outcome.upstreams
            )
        self._metrics.chat_stage_seconds.labels("upstream_first_byte").observe(answer.first_byte_s)
        self._pool.remember(answer.upstream, hashes)
        return answer

    async def _encode(self, chat: ChatRequest, scope: str | None) -> list[ItemResult]:
        results = await self._engine.encode([ImageItem(file=image.source) for image in chat.images], scope=scope)
        if self._transport == "ec":
            assert self._ec_writer is not None
            paths = await self._ec_writer.write_all([(result.hash, result.rows) for result in results])
            unwritten = [result.index for result, path in zip(results, paths, strict=True) if path is None]
            if unwritten:
                # Sending would make vLLM look for files that are not there, which kills its engine.
                raise EncoderCacheWriteFailed(
                    f"the connector files of images {unwritten} could not be written to {self._ec_writer.root} "
                    "(see the server log); the request was not sent upstream",
                    details={"items": unwritten, "storage": str(self._ec_writer.root)},
                    headers={"Retry-After": "1"},
                )
        return results

    async def _rewritten(self, chat: ChatRequest, results: list[ItemResult]) -> bytes | BodyFor:
        """The request's JSON with each image part replaced by the transport's part (for ``mooncake``, made
        per upstream, once its push has completed)."""
        dtype = self._engine.info.dtype if self._dtype == "auto" else TORCH_DTYPES[self._dtype]
        if self._transport == "mooncake":
            return self._pushed(chat, results, dtype)

        def render() -> bytes:
            for image, result in zip(chat.images, results, strict=True):
                part = embeds_part(result, dtype) if self._transport == "embeds" else ec_part(result, image.part)
                image.part.clear()
                image.part.update(part)
            return orjson.dumps(chat.body)

        large = self._transport == "embeds" and sum(r.rows.numel() for r in results) * 4 > _OFFLOAD_BYTES
        return await in_executor(self._executor, render) if large else render()

    def _pushed(self, chat: ChatRequest, results: list[ItemResult], dtype: torch.dtype) -> BodyFor:
        """A body per upstream: the rows pushed into its consumer, then the request with metadata-only
        parts and ``ec_transfer_params`` naming each item's transfer (by ``mm_hash``, and by position)."""
        pusher = self._pusher
        assert pusher is not None
        for image, result in zip(chat.images, results, strict=True):
            part = ec_part(result, image.part)
            image.part.clear()
            image.part.update(part)
        # One transfer per distinct item: the same image twice in a request is pushed once.
        rows = {result.hash: result.rows for result in results if result.hash is not None}

        async def for_upstream(upstream: Upstream) -> Prepared:
            transfer_ids = {item_hash: f"mmencode-{uuid.uuid4().hex}" for item_hash in rows}
            transfers = [Transfer(transfer_ids[h], h, item_rows) for h, item_rows in rows.items()]
            try:
                receipt = await pusher.push(self._consumers[upstream.url], transfers, dtype)
            except EncoderCachePushFailed as exc:
                raise NotSent(exc) from None
            items = [{"mm_hash": r.hash, "transfer_id": transfer_ids[r.hash]} for r in results if r.hash is not None]
            chat.body["ec_transfer_params"] = {"ec_items": items}
            return Prepared(orjson.dumps(chat.body), functools.partial(pusher.release, receipt))

        return for_upstream


def _check_pushable(chat: ChatRequest) -> None:
    """What the mooncake transport cannot forward: a consumer computes no item itself (it waits for a push
    of every one, then fails the request), and ``ec_transfer_params`` is the door's to write."""
    if "ec_transfer_params" in chat.body:
        raise UnsupportedParameter(
            "ec_transfer_params is written by the front door (the transfers of the rows it pushed); send the "
            "request without it",
            param="ec_transfer_params",
        )
    left = media_parts_left(chat)
    if left:
        raise UnsupportedParameter(
            f"{', '.join(left)}: the mooncake transport forwards images only (image_url, input_image parts, which "
            "it encodes and pushes); vLLM's ECMooncakeConnector consumer computes no item itself, so it would wait "
            "for a push of this one and then fail the request. Send this item to an upstream without the connector",
            param=left[0],
            details={"parts": left},
        )


def _sse_error(error: ServiceError) -> bytes:
    """An error event as vLLM streams one (``data: {"error": ...}``); the OpenAI client raises it."""
    return b"data: " + orjson.dumps({"error": error_object(error, None)}) + b"\n\n"
