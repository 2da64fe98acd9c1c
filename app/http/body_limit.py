"""Refuse request bodies over the limit while they stream in, before they are buffered whole."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mmencode.app.engine.errors import PayloadTooLarge
from mmencode.app.http.context import context_of
from mmencode.app.http.errors import error_response
from mmencode.app.metrics import Metrics

__all__ = ["BodyLimitMiddleware"]


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int, metrics: Metrics) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.metrics = metrics

    def _too_large(self, size: int | None) -> PayloadTooLarge:
        said = f"{size} bytes" if size is not None else "more"
        return PayloadTooLarge(
            f"request body is {said}, over the limit of {self.max_bytes} bytes (--max-body-bytes)",
            details={"limit": "max_body_bytes", "max_bytes": self.max_bytes},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            # Refused from the header alone, without reading a byte of the body.
            response = error_response(self._too_large(int(declared)), context_of(scope), self.metrics)
            await response(scope, receive, send)
            return

        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # Raised into whoever reads the body; the error handlers render it as 413.
                    raise self._too_large(None)
            return message

        await self.app(scope, counting_receive, send)
