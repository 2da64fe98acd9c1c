"""The one error body every non-2xx answer carries: OpenAI's error shape plus ``details``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

ErrorType = Literal["invalid_request_error", "server_error", "overloaded_error"]


# Every field is always sent (null when unknown), and nothing else: say so in /openapi.json too.
_EXACT = ConfigDict(extra="forbid", json_schema_serialization_defaults_required=True)


class ErrorBody(BaseModel):
    model_config = _EXACT

    message: str = Field(description="A human sentence, with the numbers involved.")
    type: ErrorType
    code: str = Field(description="Stable machine-readable code, e.g. `partial_precomputed`.")
    param: str | None = Field(default=None, description="Where in the request the problem is, e.g. `items[1].image`.")
    details: dict[str, Any] | None = Field(default=None, description="The numbers and indices involved.")
    request_id: str | None = None


class ErrorResponse(BaseModel):
    model_config = _EXACT

    error: ErrorBody
