"""OpenAI-compatible routes: ``/v1/embeddings`` (one pooled vector per image) and ``/v1/models``."""

from __future__ import annotations

import re

from fastapi import APIRouter, Request
from starlette.responses import Response

from mmencode.app.deps import RuntimeDep
from mmencode.app.errors import InvalidImage, ServiceError, UnsupportedParameter
from mmencode.app.images import is_url
from mmencode.app.openapi import ERROR_RESPONSES
from mmencode.app.responses import JSONBytesResponse, l2_normalised_mean
from mmencode.app.routes.json_body import JiterRoute
from mmencode.app.scheduler import ItemInput
from mmencode.app.wire.b64 import encode_ascii
from mmencode.schemas.embeddings import EmbeddingsRequest, EmbeddingsResponse, ModelCard, ModelList

router = APIRouter(tags=["openai"], route_class=JiterRoute)


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
    try:
        results = await scheduler.encode([ItemInput(image=image) for image in inputs])
    except ServiceError as error:
        # The scheduler names items as /v1/encode does; here the caller sent `input`.
        if error.param is not None:
            error.param = re.sub(r"^items\[(\d+)\]\.image", r"input[\1]", error.param)
        _say_images_only(error, inputs)
        raise
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


def _say_images_only(error: ServiceError, inputs: list[str]) -> None:
    """Text sent to an embeddings endpoint is the likeliest mistake: say so, not "invalid base64"."""
    where = re.fullmatch(r"input\[(\d+)\]", error.param or "")
    if not isinstance(error, InvalidImage) or where is None:
        return
    index = int(where.group(1))
    source = inputs[index]
    if is_url(source) or source[:5].lower() == "data:":
        return
    error.message = (
        f"input[{index}] is not an image: this service embeds images only, not text. Send each input as an "
        "image URL (http or https) or a data URI (data:image/png;base64,...)"
    )
    error.details = {**(error.details or {}), "accepted": ["http(s) image URL", "data:image/...;base64 URI"]}


@router.get("/v1/models", response_model=ModelList, summary="The served model (OpenAI's list shape)")
async def models(runtime: RuntimeDep) -> ModelList:
    backend = runtime.adapter.image_processor_backend if runtime.adapter is not None else None
    return ModelList(
        data=[ModelCard(id=runtime.model_name, created=runtime.started_at, image_processor_backend=backend)]
    )
