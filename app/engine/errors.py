"""The service's error tree: what went wrong, with a stable ``code``, an HTTP status and the numbers.

Every layer below the HTTP one (the engine, media decoding, the peers' formats, the APIs' services)
raises a :class:`ServiceError` subclass; ``app/http/errors.py`` renders any of them in the single error
shape of ``schemas.errors``. Nothing here knows HTTP frameworks or wire schemas: the status is data.

An error about one item of a request carries an :class:`ItemLocation` (the item's index and the field,
as data); each API names items its own way when the error is rendered (``app/http/errors.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Self

__all__ = [
    "ErrorType",
    "InternalError",
    "InvalidAudio",
    "InvalidImage",
    "InvalidRequest",
    "InvalidVideo",
    "ItemLocation",
    "MediaFetchFailed",
    "MissingMetadata",
    "ModelNotFound",
    "NotReady",
    "Overloaded",
    "PartialPrecomputed",
    "PayloadTooLarge",
    "PrecomputedShapeMismatch",
    "RequestTimeout",
    "ServiceError",
    "TokenCountMismatch",
    "UnknownHash",
    "UnsupportedModality",
    "UnsupportedParameter",
    "UrlNotAllowed",
    "ValidationFailed",
]

# OpenAI's error types (schemas.errors.ErrorType says the same on the wire).
ErrorType = Literal["invalid_request_error", "server_error", "overloaded_error"]


@dataclass(frozen=True, slots=True)
class ItemLocation:
    """Which item of a request an error is about, and which of its fields (the engine's names: ``image``,
    ``video``, ``audio``, ``hash``, ``precomputed_embedding``...; ``()`` for the item itself); ``index``
    None: the items as a whole (too many of them, say)."""

    index: int | None
    field: tuple[str | int, ...]
    # The message and details already speak of the item (or of several): front ends add nothing.
    named_in_message: bool = False


class ServiceError(Exception):
    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal_error"
    type: ClassVar[ErrorType] = "server_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        location: ItemLocation | None = None,
        details: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        # A request-level field (``dimensions``, ``model``); item fields go in ``location``.
        self.param = param
        self.location = location
        self.details = dict(details) if details is not None else None
        self.headers = dict(headers or {})

    def at_item(self, index: int, field: tuple[str | int, ...]) -> Self:
        """Attach where the error happened, as the layer that knows the item does; a location set by
        the layer that raised (which knew the field better) is kept."""
        if self.location is None and self.param is None:
            self.location = ItemLocation(index, field)
        return self


class InvalidRequest(ServiceError):
    status = 400
    code = "bad_request"
    type = "invalid_request_error"


class ValidationFailed(InvalidRequest):
    status = 422
    code = "validation_error"


class PartialPrecomputed(InvalidRequest):
    code = "partial_precomputed"


class MissingMetadata(InvalidRequest):
    code = "missing_metadata"


class PrecomputedShapeMismatch(InvalidRequest):
    code = "precomputed_shape_mismatch"


class InvalidImage(InvalidRequest):
    code = "invalid_image"


class InvalidVideo(InvalidRequest):
    """Not a video FFmpeg decodes, truncated, without frames, or refused by the model's video processor."""

    code = "invalid_video"


class InvalidAudio(InvalidRequest):
    """Not audio FFmpeg decodes, truncated, silent of samples, or in a layout the service does not take."""

    code = "invalid_audio"


class UnsupportedModality(InvalidRequest):
    """A video (or audio) item for a model that takes images only, or a server without the decoder."""

    code = "unsupported_modality"


class MediaFetchFailed(InvalidRequest):
    """A media URL could not be fetched (image, video or audio alike: the code predates the others)."""

    code = "image_fetch_failed"


class UrlNotAllowed(InvalidRequest):
    code = "url_not_allowed"


class UnknownHash(InvalidRequest):
    code = "unknown_hash"


class ModelNotFound(InvalidRequest):
    status = 404
    code = "model_not_found"


class PayloadTooLarge(InvalidRequest):
    status = 413
    code = "payload_too_large"


class UnsupportedParameter(InvalidRequest):
    code = "unsupported_parameter"


class TokenCountMismatch(ServiceError):
    code = "token_count_mismatch"


class Overloaded(ServiceError):
    status = 503
    code = "overloaded"
    type = "overloaded_error"


class NotReady(ServiceError):
    status = 503
    code = "not_ready"


class RequestTimeout(ServiceError):
    status = 504
    code = "timeout"


class InternalError(ServiceError):
    pass
