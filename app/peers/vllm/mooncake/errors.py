"""The one error a Mooncake push answers with, wherever it was asked for (the front door, ``/v1/encode``)."""

from __future__ import annotations

from mmencode.app.engine.errors import ServiceError

__all__ = ["EncoderCachePushFailed"]


class EncoderCachePushFailed(ServiceError):
    """The rows did not all reach the consumer (refused, unreachable, a failed write, a lost reservation):
    whatever was reserved is cancelled, and the request that needed them is not sent."""

    status = 503
    code = "ec_push_failed"
