"""OpenAI-compatible routes: ``/v1/embeddings`` (one pooled vector per image) and ``/v1/models``."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from mmencode.app.api.deps import EmbeddingsServiceDep, MetricsDep
from mmencode.app.http.cancellation import cancel_on_disconnect
from mmencode.app.http.context import context_of
from mmencode.app.http.errors import locate_errors_as
from mmencode.app.http.json_body import JiterRoute
from mmencode.app.http.locators import ErrorLocator
from mmencode.app.http.openapi import ERROR_RESPONSES
from mmencode.app.http.responses import JSONBytesResponse
from mmencode.schemas.embeddings import EmbeddingsRequest, EmbeddingsResponse, ModelList

# The caller names its images `input[i]`; the image is the input itself, not a field of it.
EMBEDDINGS_LOCATOR = ErrorLocator("input", "input[{index}]", {"image": None})
router = APIRouter(
    tags=["openai"], route_class=JiterRoute, dependencies=[Depends(locate_errors_as(EMBEDDINGS_LOCATOR))]
)


@router.post(
    "/v1/embeddings",
    response_model=EmbeddingsResponse,
    responses=ERROR_RESPONSES,
    summary="One L2-normalised mean-pooled vector per image (OpenAI's shape)",
)
async def embeddings(
    body: EmbeddingsRequest, request: Request, service: EmbeddingsServiceDep, metrics: MetricsDep
) -> Response:
    answer = await cancel_on_disconnect(request, service.embed(body, scope=context_of(request).cache_scope), metrics)
    context = context_of(request)
    context.items, context.tokens = len(answer["data"]), answer["usage"]["total_tokens"]
    return JSONBytesResponse(answer)


@router.get("/v1/models", response_model=ModelList, summary="The served model (OpenAI's list shape)")
async def models(service: EmbeddingsServiceDep) -> ModelList:
    return service.models()
