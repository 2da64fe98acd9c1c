"""``/v1/encode``'s work: items in, the answer's bytes out (JSON or safetensors), connector files written, or
the rows pushed into a vLLM ``ECMooncakeConnector`` consumer (``ec_transfer_params``) before the answer."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import orjson

from mmencode.app.api.encode.response import PayloadMemo, render_encode_response
from mmencode.app.config import consumer_address
from mmencode.app.engine.engine import Engine
from mmencode.app.engine.errors import InvalidRequest, UnsupportedParameter
from mmencode.app.engine.threads import in_executor
from mmencode.app.engine.types import Item, ItemResult
from mmencode.app.peers.vllm.ec_writer import EncoderCacheWriter
from mmencode.app.peers.vllm.mooncake.push import MooncakePusher, Transfer
from mmencode.app.wire.encodings import TORCH_DTYPES
from mmencode.schemas.encode import EcTransferParams, EncodeOptions

__all__ = ["EncodeAnswer", "EncodeService"]

# Answers whose rows are past this are written on a thread: a 40 MB base64 string must not stall the loop.
_OFFLOAD_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class EncodeAnswer:
    body: bytes
    items: int
    tokens: int


class EncodeService:
    def __init__(
        self,
        engine: Engine,
        *,
        memo: PayloadMemo | None,
        ec_writer: EncoderCacheWriter | None,
        pusher: MooncakePusher | None = None,
        push_consumers: Sequence[str] = (),
        executor: Executor | None = None,
    ) -> None:
        self._engine = engine
        self._memo = memo
        self._executor = executor  # renders large answers off the event loop
        # vLLM's encoder-cache connector files (--ec-shared-storage), written before the answer.
        self._ec_writer = ec_writer
        # Pushes into ECMooncakeConnector consumers, to those --ec-push-consumers allows ("*": any).
        self._pusher = pusher
        self._push_consumers = frozenset(push_consumers)

    async def encode(
        self, options: EncodeOptions, items: list[Item], *, binary: bool, request_id: str, scope: str | None = None
    ) -> EncodeAnswer:
        """The answer to ``items``: a safetensors container when ``binary``, else JSON. ``scope``: the
        request's cache scope (its tenant's)."""
        self._engine.check_model(options.model)
        target = options.ec_transfer_params
        consumer = self._push_target(target, len(items)) if target is not None else None
        results = await self._engine.encode(items, options.precomputed, scope=scope)
        answer = _answer(request_id, self._engine.model_name, results)
        if target is not None and consumer is not None:
            # Answered once every item is complete on the consumer: the proxy's chat request may follow at once.
            await self._push(target, consumer, results, options.dtype, answer)
            for item in answer["items"]:
                item["embedding"] = None  # the rows went to the consumer; the proxy needs the hashes
            return EncodeAnswer(orjson.dumps(answer), items=len(results), tokens=sum(r.num_tokens for r in results))
        if self._ec_writer is not None:
            # vLLM checks for the file as soon as the language request arrives: write before answering.
            paths = await self._ec_writer.write_all([(r.hash, r.rows) for r in results])
            for item, path in zip(answer["items"], paths, strict=True):
                item["ec_cache_path"] = None if path is None else str(path)

        def render() -> bytes:
            return render_encode_response(
                answer,
                results,
                encoding_format="safetensors" if binary else options.encoding_format,
                dtype=options.dtype,
                pooling=options.pooling,
                memo=self._memo,
            )

        large = sum(r.rows.numel() for r in results) * 4 > _OFFLOAD_BYTES
        body = await in_executor(self._executor, render) if large else render()
        return EncodeAnswer(body, items=len(results), tokens=sum(r.num_tokens for r in results))

    def _push_target(self, target: EcTransferParams, items: int) -> str:
        """The consumer's control address, refused before any work unless this server may push there and the
        transfer ids, if given, name one item each. (A 400, not a validation error: the count is not the
        schema's to state.)"""
        if self._pusher is None:
            raise UnsupportedParameter(
                "this server pushes to no vLLM ECMooncakeConnector consumer: start it with --ec-push-consumers "
                "HOST:PORT (and the mooncake extra) to take ec_transfer_params",
                param="ec_transfer_params",
            )
        given = target.ec_items
        if given is not None:
            if len(given) != items:
                raise InvalidRequest(
                    f"`ec_transfer_params.ec_items` has {len(given)} entries for {items} items: one per item, in order",
                    param="ec_transfer_params.ec_items",
                )
            if len({item.transfer_id for item in given}) != len(given):
                raise InvalidRequest(
                    "each `ec_transfer_params.ec_items[].transfer_id` names one item: make them unique",
                    param="ec_transfer_params.ec_items",
                )
        try:
            consumer = consumer_address(target.consumer_zmq)
        except ValueError as exc:
            raise UnsupportedParameter(str(exc), param="ec_transfer_params.consumer_zmq") from None
        if "*" not in self._push_consumers and consumer not in self._push_consumers:
            raise UnsupportedParameter(
                f"{consumer} is not a consumer this server pushes to (--ec-push-consumers: "
                f"{', '.join(sorted(self._push_consumers)) or 'none'})",
                param="ec_transfer_params.consumer_zmq",
                details={"allowed": sorted(self._push_consumers)},
            )
        return consumer

    async def _push(
        self, target: EcTransferParams, consumer: str, results: list[ItemResult], dtype: str, answer: dict[str, Any]
    ) -> None:
        assert self._pusher is not None
        unnamed = [result.index for result in results if result.hash is None]
        if unnamed:
            # vLLM names a pushed item by its mm_hash, the part's uuid: rows without a content hash have none.
            raise InvalidRequest(
                f"items {unnamed} are precomputed and have no hash, which a push needs (vLLM's name for the item)",
                param="ec_transfer_params",
                details={"items": unnamed},
            )
        given = target.ec_items
        transfer_ids = (
            [item.transfer_id for item in given] if given else [f"mmencode-{uuid.uuid4().hex}" for _ in results]
        )
        transfers = [
            Transfer(transfer_id, str(result.hash), result.rows)
            for transfer_id, result in zip(transfer_ids, results, strict=True)
        ]
        await self._pusher.push(consumer, transfers, TORCH_DTYPES[dtype])
        pushed = [{"mm_hash": t.mm_hash, "transfer_id": t.transfer_id} for t in transfers]
        answer["ec_transfer_params"] = {"ec_items": pushed}


def _answer(request_id: str, model: str, results: list[ItemResult]) -> dict[str, Any]:
    """Every field of the answer but the items' ``embedding``, which the renderer writes."""
    items = [
        {
            "index": result.index,
            "source": result.source,
            "hash": result.hash,
            "num_tokens": result.num_tokens,
            "metadata": result.metadata,
        }
        for result in results
    ]
    return {
        "id": f"enc-{request_id}",
        "model": model,
        "items": items,
        "usage": {
            "items": len(results),
            "tokens": sum(r.num_tokens for r in results),
            "encoded_items": sum(r.source == "encoder" for r in results),
            "cached_items": sum(r.source == "cache" for r in results),
            "precomputed_items": sum(r.source == "precomputed" for r in results),
        },
    }
