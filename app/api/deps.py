"""Typed dependencies: the serving objects ``create_app`` put on ``app.state``, one per API."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import Depends, Request

from mmencode.app.api.chat.service import ChatService
from mmencode.app.api.encode.service import EncodeService
from mmencode.app.api.openai.service import EmbeddingsService
from mmencode.app.config import Settings
from mmencode.app.engine.engine import Engine
from mmencode.app.metrics import Metrics
from mmencode.app.peers.sglang.bridge import SGLangEncoderBridge

__all__ = [
    "ChatServiceDep",
    "EmbeddingsServiceDep",
    "EncodeServiceDep",
    "EngineDep",
    "MetricsDep",
    "SGLangBridgeDep",
    "SettingsDep",
]


def _state(attribute: str) -> Callable[[Request], Awaitable[Any]]:
    """A dependency reading one of ``app.state``'s serving objects.

    Async though it never awaits: FastAPI runs a plain ``def`` dependency on its thread pool, a thread
    hop (and a wait for a free thread under load) on every request for an attribute lookup.
    """

    async def read(request: Request) -> Any:
        return getattr(request.app.state, attribute)

    return read


# The engine (probes only: the APIs go through their services).
EngineDep = Annotated[Engine, Depends(_state("engine"))]
EncodeServiceDep = Annotated[EncodeService, Depends(_state("encode_service"))]
EmbeddingsServiceDep = Annotated[EmbeddingsService, Depends(_state("embeddings_service"))]
# None without --upstream: the front door is off.
ChatServiceDep = Annotated[ChatService | None, Depends(_state("chat_service"))]
SGLangBridgeDep = Annotated[SGLangEncoderBridge, Depends(_state("sglang_bridge"))]
MetricsDep = Annotated[Metrics, Depends(_state("metrics"))]
SettingsDep = Annotated[Settings, Depends(_state("settings"))]
