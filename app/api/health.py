"""Probes: liveness never touches the model; readiness says whether requests can be served now (the model
loaded and warm, and, with the chat front door on, at least one healthy upstream)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import Response

from mmencode.app.api.deps import ChatServiceDep, EngineDep, MetricsDep
from mmencode.app.engine.errors import NotReady
from mmencode.app.http.openapi import ERROR_RESPONSES

router = APIRouter(tags=["probes"])


@router.get("/health", summary="Liveness: 200 while the process serves HTTP")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/ready",
    summary="Readiness: 200 once the model is loaded and warmed up (and, with --upstream, an upstream is healthy)",
    responses={503: ERROR_RESPONSES[503]},
)
async def ready(engine: EngineDep, chat: ChatServiceDep) -> dict[str, Any]:
    if not engine.ready:
        raise NotReady(engine.not_ready_reason(), details={"phase": engine.phase.value})
    info = engine.info
    answer: dict[str, Any] = {
        "status": "ready",
        "model": info.model_name,
        "phase": engine.phase.value,
        "image_processor_backend": info.image_processor_backend,
    }
    if chat is not None:
        upstreams = chat.pool.status()
        if not any(upstream["healthy"] is True for upstream in upstreams):
            # A balancer probing /ready would keep sending chat traffic that can only answer 503: with the
            # front door on, no healthy upstream is not ready (the encoder's own APIs included, which a
            # balancer cannot tell apart). /health stays liveness only.
            down = "; ".join(f"{u['url']}: {u['error'] or 'not checked yet'}" for u in upstreams)
            raise NotReady(
                f"no upstream is healthy ({down})",
                details={"phase": engine.phase.value, "upstreams": upstreams},
                headers={"Retry-After": "5"},
            )
        answer["upstreams"] = upstreams
    return answer


@router.get(
    "/metrics",
    summary="Prometheus metrics (text exposition format)",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text format"}},
)
async def metrics(registry: MetricsDep) -> Response:
    return Response(registry.render(), media_type=CONTENT_TYPE_LATEST)
