"""The chat front door's errors: its upstreams, and the connector files it must write first."""

from __future__ import annotations

from typing import Any

from mmencode.app.engine.errors import ServiceError

__all__ = ["EncoderCacheWriteFailed", "UpstreamFailed", "UpstreamRefused", "UpstreamTimeout", "UpstreamUnavailable"]


class UpstreamUnavailable(ServiceError):
    """No healthy upstream serves the request's model now (all down, or all left the rotation)."""

    status = 503
    code = "upstream_unavailable"


class UpstreamFailed(ServiceError):
    """Every upstream tried failed before answering (connection refused or reset, closed mid-answer)."""

    status = 502
    code = "upstream_failed"


class UpstreamTimeout(ServiceError):
    status = 504
    code = "upstream_timeout"


class UpstreamRefused(ServiceError):
    """The upstream answered an error: its status and message reach the client as they were."""

    code = "upstream_error"

    def __init__(self, status: int, message: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.status = status  # type: ignore[misc]  # the upstream's, not the class's
        if status < 500:
            self.type = "invalid_request_error"  # type: ignore[misc]


class EncoderCacheWriteFailed(ServiceError):
    """A connector file could not be written: sending the request would make vLLM look for it (and die)."""

    status = 503
    code = "ec_write_failed"
