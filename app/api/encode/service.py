"""``/v1/encode``'s work: items in, the answer's bytes out (JSON or safetensors), connector files written."""

from __future__ import annotations

from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from mmencode.app.api.encode.response import PayloadMemo, render_encode_response
from mmencode.app.engine.engine import Engine
from mmencode.app.engine.threads import in_executor
from mmencode.app.engine.types import Item, ItemResult
from mmencode.app.peers.vllm.ec_writer import EncoderCacheWriter
from mmencode.schemas.encode import EncodeOptions

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
        executor: Executor | None = None,
    ) -> None:
        self._engine = engine
        self._memo = memo
        self._executor = executor  # renders large answers off the event loop
        # vLLM's encoder-cache connector files (--ec-shared-storage), written before the answer.
        self._ec_writer = ec_writer

    async def encode(
        self, options: EncodeOptions, items: list[Item], *, binary: bool, request_id: str, scope: str | None = None
    ) -> EncodeAnswer:
        """The answer to ``items``: a safetensors container when ``binary``, else JSON. ``scope``: the
        request's cache scope (its tenant's)."""
        self._engine.check_model(options.model)
        results = await self._engine.encode(items, options.precomputed, scope=scope)
        answer = _answer(request_id, self._engine.model_name, results)
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
