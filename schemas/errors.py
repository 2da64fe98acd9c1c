"""The one error body every non-2xx answer carries: OpenAI's error shape plus ``details``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

ErrorType = Literal["invalid_request_error", "server_error", "overloaded_error"]


class ErrorBody(BaseModel):
    message: str = Field(description="A human sentence, with the numbers involved.")
    type: ErrorType
    code: str = Field(description="Stable machine-readable code, e.g. `partial_precomputed`.")
    param: str | None = Field(default=None, description="Where in the request the problem is, e.g. `items[1].image`.")
    details: dict[str, Any] | None = Field(default=None, description="The numbers and indices involved.")
    request_id: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody
