"""``POST /v1/chat/completions``: the front door to the upstream LLM servers (``--upstream``).

The route reads the request (:mod:`app.api.chat.request`), hands it to
:class:`app.api.chat.service.ChatService`, and answers with the upstream's own bytes: a JSON body, or its
server-sent events passed through unchanged. Nothing is answered until the upstream has started a
successful answer, so an upstream's error keeps its status. A client that disconnects cancels the
encoding, or the upstream's request once it is under way.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

from mmencode.app.api.chat.request import ChatItemLocator, parse_chat
from mmencode.app.api.chat.service import ChatOutcome
from mmencode.app.api.deps import ChatServiceDep, MetricsDep
from mmencode.app.http.cancellation import cancel_on_disconnect
from mmencode.app.http.context import context_of
from mmencode.app.http.errors import RouteNotFound, locate_errors_as
from mmencode.app.http.openapi import ERROR_RESPONSES

# The router's locator names the messages as a whole; a parsed request's own names each image part by its
# place in `messages` (ChatItemLocator.of), set as soon as the request is read.
router = APIRouter(tags=["openai"], dependencies=[Depends(locate_errors_as(ChatItemLocator("messages", "{path}")))])

_REQUEST_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "description": "OpenAI's chat completion request, as the upstream vLLM accepts it. Image parts "
                    "(`image_url` with a data URI or http(s) URL, `input_image`) are encoded here and sent upstream "
                    "as `image_embeds` parts; every other field and part goes upstream unchanged.",
                    "required": ["messages"],
                    "properties": {
                        "model": {"type": "string", "description": "An upstream's model (GET /v1/models)."},
                        "messages": {"type": "array", "minItems": 1, "items": {"type": "object"}},
                        "stream": {"type": "boolean", "default": False},
                    },
                    "additionalProperties": True,
                }
            }
        },
    }
}
_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES,
    200: {
        "description": "The upstream's answer: a chat completion, or its server-sent events with `stream: true`.",
        "content": {"application/json": {}, "text/event-stream": {}},
    },
    404: {**ERROR_RESPONSES[404], "description": "model_not_found, or not_found when no --upstream is configured"},
    502: {**ERROR_RESPONSES[500], "description": "upstream_failed: no upstream could answer"},
    503: {**ERROR_RESPONSES[503], "description": "upstream_unavailable, ec_write_failed, overloaded or not_ready"},
    504: {**ERROR_RESPONSES[504], "description": "timeout (encoding) or upstream_timeout"},
}


@router.post(
    "/v1/chat/completions",
    summary="Chat through the upstream LLM servers, with the images encoded here (OpenAI's API)",
    responses=_RESPONSES,
    response_model=None,
    openapi_extra=_REQUEST_BODY,
)
async def chat_completions(request: Request, service: ChatServiceDep, metrics: MetricsDep) -> Response:
    if service is None:
        raise RouteNotFound(
            "the chat front door is off: start mmencode with --upstream URL (an OpenAI-compatible vLLM server)"
        )
    chat = parse_chat(await request.body())
    context = context_of(request)
    # The router's locator names a part by its place in `messages`, which only the parsed request knows.
    context.locator = ChatItemLocator.of(chat)
    context.items = len(chat.images)
    outcome = ChatOutcome()
    try:
        if chat.stream:
            stream = await cancel_on_disconnect(
                request, service.stream(chat, outcome=outcome, scope=context.cache_scope), metrics
            )
            return StreamingResponse(
                stream.body(),
                media_type=stream.media_type,
                # Proxies in front must pass each event on as it comes.
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                # Releases the upstream even if the stream never started (a client gone at once).
                background=BackgroundTask(stream.aclose),
            )
        media_type, body = await cancel_on_disconnect(
            request, service.complete(chat, outcome=outcome, scope=context.cache_scope), metrics
        )
        return Response(body, media_type=media_type)
    finally:
        # The access line names the upstream(s) asked: the one that answered last.
        context.upstream = ",".join(outcome.upstreams) or None
        context.tokens = outcome.tokens
