"""Typed dependencies: the serving objects ``create_app`` put on ``app.state``, one per API."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from mmencode.app.config import Settings
from mmencode.app.integrations.sglang import SGLangEncoderBridge
from mmencode.app.metrics import Metrics
from mmencode.app.runtime import Runtime
from mmencode.app.services import EmbeddingsService, EncodeService

__all__ = [
    "EmbeddingsServiceDep",
    "EncodeServiceDep",
    "MetricsDep",
    "RuntimeDep",
    "SGLangBridgeDep",
    "SettingsDep",
]


# Async though they never await: FastAPI runs a plain ``def`` dependency on its thread pool, a thread
# hop (and a wait for a free thread under load) on every request for an attribute lookup.
async def _runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


async def _encode_service(request: Request) -> EncodeService:
    service: EncodeService = request.app.state.encode_service
    return service


async def _embeddings_service(request: Request) -> EmbeddingsService:
    service: EmbeddingsService = request.app.state.embeddings_service
    return service


async def _sglang_bridge(request: Request) -> SGLangEncoderBridge:
    bridge: SGLangEncoderBridge = request.app.state.sglang_bridge
    return bridge


async def _metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


async def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


# The model's lifecycle (probes only: the APIs go through their services).
RuntimeDep = Annotated[Runtime, Depends(_runtime)]
EncodeServiceDep = Annotated[EncodeService, Depends(_encode_service)]
EmbeddingsServiceDep = Annotated[EmbeddingsService, Depends(_embeddings_service)]
SGLangBridgeDep = Annotated[SGLangEncoderBridge, Depends(_sglang_bridge)]
MetricsDep = Annotated[Metrics, Depends(_metrics)]
SettingsDep = Annotated[Settings, Depends(_settings)]
