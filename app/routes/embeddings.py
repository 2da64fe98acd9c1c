"""OpenAI-compatible routes: ``/v1/embeddings`` (one pooled vector per image) and ``/v1/models``."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from mmencode.app.deps import RuntimeDep
from mmencode.app.errors import ErrorLocator, UnsupportedParameter, locate_errors_as
from mmencode.app.openapi import ERROR_RESPONSES
from mmencode.app.responses import JSONBytesResponse, l2_normalised_mean
from mmencode.app.routes.json_body import JiterRoute
from mmencode.app.scheduler import ItemInput
from mmencode.app.wire.b64 import encode_ascii
from mmencode.schemas.embeddings import EmbeddingsRequest, EmbeddingsResponse, ModelCard, ModelList

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
async def embeddings(body: EmbeddingsRequest, request: Request, runtime: RuntimeDep) -> Response:
    runtime.check_model(body.model)
    scheduler = runtime.scheduler
    width = scheduler.adapter.hidden_size
    if body.dimensions is not None and body.dimensions != width:
        raise UnsupportedParameter(
            f"dimensions={body.dimensions} is not supported: {runtime.model_name} returns {width}-dimensional vectors",
            param="dimensions",
            details={"requested": body.dimensions, "supported": [width]},
        )
    inputs = [body.input] if isinstance(body.input, str) else body.input
    results = await scheduler.encode([ItemInput(image=image) for image in inputs])
    tokens = sum(result.num_tokens for result in results)
    request.state.items, request.state.tokens = len(results), tokens
    data = []
    for result in results:
        vector = l2_normalised_mean(result.rows)
        encoded = encode_ascii(vector.astype("<f4").tobytes()) if body.encoding_format == "base64" else vector
        data.append({"object": "embedding", "index": result.index, "embedding": encoded})
    return JSONBytesResponse(
        {
            "object": "list",
            "data": data,
            "model": runtime.model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )


@router.get("/v1/models", response_model=ModelList, summary="The served model (OpenAI's list shape)")
async def models(runtime: RuntimeDep) -> ModelList:
    backend = runtime.adapter.image_processor_backend if runtime.adapter is not None else None
    return ModelList(
        data=[ModelCard(id=runtime.model_name, created=runtime.started_at, image_processor_backend=backend)]
    )
