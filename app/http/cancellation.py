"""A client that hangs up cancels its request's work, as vLLM's ``with_cancellation`` does.

Once a request's body is read, the only message its client can still send is ``http.disconnect``;
:func:`cancel_on_disconnect` races the work against it. Cancelling the work cancels whatever it awaits:
a URL fetch, preprocessing not yet started, and its place in the encoder's queue (the worker drops a
job whose request gave up before the forward).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

from starlette.requests import Request

from mmencode.app.engine.errors import ServiceError
from mmencode.app.metrics import Metrics

__all__ = ["ClientDisconnected", "cancel_on_disconnect"]

T = TypeVar("T")


class ClientDisconnected(ServiceError):
    """Nobody reads this answer; the status is nginx's "client closed request", for the access line."""

    status = 499
    code = "client_disconnected"
    type = "invalid_request_error"


async def cancel_on_disconnect(request: Request, work: Coroutine[Any, Any, T], metrics: Metrics) -> T:
    """``work``'s result, or :class:`ClientDisconnected` after cancelling it if the client left first."""
    task = asyncio.ensure_future(work)
    listener = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({task, listener}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        metrics.client_disconnects.inc()
        raise ClientDisconnected("the client disconnected before the answer; its work was cancelled")
    finally:
        listener.cancel()
        if not task.done():  # this handler itself was cancelled (server shutdown): take the work along
            task.cancel()


async def _disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
