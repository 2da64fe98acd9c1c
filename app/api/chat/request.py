"""An OpenAI chat request as the front door reads it: the body as JSON, and its images.

Only what the front door acts on is read; everything else (sampling settings, tools, text, audio and
video parts) is the upstream's to validate and travels unchanged. Image parts are ``image_url`` (a data
URI or an http(s) URL; vLLM's bare-string form too) and ``input_image`` (the Responses API's). Parts
already holding rows (``image_embeds``) are the caller's and pass through.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from mmencode.app.engine.errors import ItemLocation, ServiceError, UnsupportedParameter, ValidationFailed
from mmencode.app.http.locators import ErrorLocator
from mmencode.app.http.validation import validation_error

__all__ = ["ChatImage", "ChatItemLocator", "ChatRequest", "media_parts_left", "parse_chat"]

# Request fields that change how vLLM preprocesses an image: mmencode preprocesses with the server's own
# settings, so a request that carries them would get rows made otherwise than it asked (vllm#56786).
_PREPROCESSING_FIELDS = ("mm_processor_kwargs", "media_io_kwargs")


@dataclass(frozen=True, slots=True)
class ChatImage:
    """One image part: where it is (for errors), what it holds, and the part object to replace."""

    path: str  # messages[0].content[1].image_url.url
    source: str  # a data URI or an http(s) URL (anything else is refused as the scheduler refuses it)
    part: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ChatRequest:
    body: dict[str, Any]
    model: str | None
    stream: bool
    images: list[ChatImage]


def parse_chat(raw: bytes) -> ChatRequest:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _invalid(["body"], f"invalid JSON: {exc}", "json_invalid") from None
    if not isinstance(body, dict):
        raise _invalid(["body"], "must be a JSON object (an OpenAI chat completion request)", "model_type")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _invalid(["messages"], "a non-empty list of messages is required", "missing")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _invalid(["model"], "must be a string", "string_type")
    images: list[ChatImage] = []
    for m, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _invalid(["messages", m], "must be an object with `role` and `content`", "model_type")
        content = message.get("content")
        if not isinstance(content, list):
            continue  # text (a string), or nothing: the upstream's to judge
        for p, part in enumerate(content):
            image = _image_of(part, f"messages[{m}].content[{p}]")
            if image is not None:
                images.append(image)
    if images:
        _refuse_preprocessing_fields(body)
    return ChatRequest(body=body, model=model, stream=body.get("stream") is True, images=images)


# vLLM's multimodal content parts other than the images the door encodes (image_url, input_image).
_MEDIA_PART_TYPES = frozenset(
    {"image_embeds", "image_pil", "video_url", "video_embeds", "input_audio", "audio_url", "audio_embeds"}
)


def media_parts_left(chat: ChatRequest) -> list[str]:
    """Where the request holds media the door does not encode (they go upstream as they came)."""
    found = []
    for m, message in enumerate(chat.body["messages"]):
        content = message.get("content")
        if isinstance(content, list):
            for p, part in enumerate(content):
                if isinstance(part, dict) and part.get("type") in _MEDIA_PART_TYPES:
                    found.append(f"messages[{m}].content[{p}]")
    return found


def _image_of(part: Any, where: str) -> ChatImage | None:
    if not isinstance(part, dict):
        return None
    kind = part.get("type")
    if kind == "image_url" or (kind is None and "image_url" in part):
        value = part.get("image_url")
        if isinstance(value, dict):
            return ChatImage(f"{where}.image_url.url", _source(value.get("url"), f"{where}.image_url.url"), part)
        return ChatImage(f"{where}.image_url", _source(value, f"{where}.image_url"), part)
    if kind == "input_image":
        value = part.get("image_url")
        if isinstance(value, dict):  # tolerated: the chat form inside a Responses-style part
            return ChatImage(f"{where}.image_url.url", _source(value.get("url"), f"{where}.image_url.url"), part)
        return ChatImage(f"{where}.image_url", _source(value, f"{where}.image_url"), part)
    return None


def _source(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise _invalid(where.split("."), "must be an image's data URI or http(s) URL", "string_type")
    return value


def _refuse_preprocessing_fields(body: dict[str, Any]) -> None:
    """Refuse, never drop: rows made with other settings than the request names would be silently wrong."""
    for name in _PREPROCESSING_FIELDS:
        value = body.get(name)
        if value in (None, {}):
            continue
        keys = sorted(value) if isinstance(value, dict) else value
        raise UnsupportedParameter(
            f"{name} {keys} cannot be applied to images the front door encodes: mmencode preprocesses with "
            "the server's settings (the checkpoint's processor config, --image-processor-backend), and an "
            "upstream given both would place rows made one way under settings that say another. Put the "
            f"setting in the checkpoint's processor config for both servers, or send this request without {name}",
            param=name,
            details={"unsupported": keys},
        )


def _invalid(loc: list[Any], message: str, kind: str) -> ValidationFailed:
    return validation_error([{"loc": loc, "msg": message, "type": kind}], subject="an OpenAI chat completion request")


@dataclass(frozen=True, slots=True)
class ChatItemLocator(ErrorLocator):
    """Names the i-th image of a chat request by where it sits: ``messages[0].content[1].image_url.url``."""

    paths: tuple[str, ...] = ()

    @classmethod
    def of(cls, request: ChatRequest) -> ChatItemLocator:
        return cls("messages", "{path}", {}, tuple(image.path for image in request.images))

    def param(self, location: ItemLocation) -> str:
        if location.index is None or location.index >= len(self.paths):
            return self.collection
        return self.paths[location.index]

    def message(self, error: ServiceError) -> str:
        location = error.location
        if location is None or location.index is None or location.named_in_message or location.index >= len(self.paths):
            return error.message
        return f"{self.paths[location.index]}: {error.message}"
