"""Sending a chat request upstream: one attempt per upstream until one starts a good answer.

Nothing reaches the client until an upstream has answered a success status *and* its first body bytes
(the whole body when not streaming): everything that can go wrong before then is retried on another
upstream or becomes an error with the upstream's own status and message, never a 200 followed by a
dead stream (vllm#54140). Once bytes have gone to the client, a failure can only end the stream.

Retried on another upstream: no connection, a connection lost before the first byte, and 502/503 (a
server that is not taking work). Not retried: an answer's own error (a 4xx: the request is wrong
everywhere), a 500, and a timeout (a busy server would only pass its load on).

The body may be made per upstream (:data:`BodyFor`): the ``mooncake`` transport pushes the rows into the
chosen upstream's own consumer first. A push that fails (:class:`NotSent`) moves on to the next upstream
without sending anything; a prepared body whose attempt does not start an answer is released (its
reservations cancelled), since nothing will ask for its rows.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from mmencode.app.api.chat.errors import UpstreamFailed, UpstreamRefused, UpstreamTimeout
from mmencode.app.api.chat.upstreams import Upstream, UpstreamPool
from mmencode.app.engine.errors import ServiceError
from mmencode.app.metrics import Metrics

__all__ = ["BodyFor", "NotSent", "Prepared", "UpstreamAnswer", "UpstreamForwarder"]

_RETRIED_STATUSES = frozenset({502, 503})
# An upstream's error body is read whole up to this, for its message.
_ERROR_BODY_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Prepared:
    """The bytes for one upstream, and what undoes their preparation when no answer starts."""

    body: bytes
    release: Callable[[], None] | None = None


# The body for the upstream just chosen, made then (a Mooncake push goes to that upstream's consumer).
BodyFor = Callable[[Upstream], Awaitable[Prepared]]


class NotSent(Exception):
    """The request could not be prepared for this upstream (its consumer refused the rows): try the next."""

    def __init__(self, error: ServiceError) -> None:
        super().__init__(error.message)
        self.error = error


@dataclass
class UpstreamAnswer:
    """A started upstream answer: its status line is a success and its first bytes are in hand."""

    upstream: Upstream
    media_type: str
    first: bytes  # the whole body when not streaming
    _rest: AsyncIterator[bytes] | None
    _stack: contextlib.AsyncExitStack
    first_byte_s: float

    async def rest(self) -> AsyncIterator[bytes]:
        """The bytes after ``first``, as the upstream sends them."""
        if self._rest is not None:
            async for chunk in self._rest:
                yield chunk

    async def aclose(self) -> None:
        """Release the upstream: closing a response not read to its end closes its connection, which vLLM
        takes as the client's disconnect and aborts the request."""
        await self._stack.aclose()


class UpstreamForwarder:
    def __init__(
        self, pool: UpstreamPool, client: httpx.AsyncClient, metrics: Metrics, headers: dict[str, str]
    ) -> None:
        self._pool = pool
        self._client = client
        self._metrics = metrics
        self._headers = {
            **headers,
            "content-type": "application/json",
            # The bytes on the wire are the bytes the client gets: no compression to undo or redo.
            "accept-encoding": "identity",
        }

    async def open(
        self,
        body: bytes | BodyFor,
        *,
        model: str | None,
        hashes: list[str],
        stream: bool,
        tried: list[str] | None = None,
    ) -> UpstreamAnswer:
        """The first upstream answer that starts well. ``tried``: each upstream asked is appended (its URL)."""
        asked: list[Upstream] = []
        failures: list[dict[str, Any]] = []
        not_sent: list[ServiceError] = []
        while True:
            try:
                upstream = self._pool.choose(model, hashes, exclude=asked)
            except ServiceError as exc:
                if not failures:
                    raise
                if len(not_sent) == len(failures):
                    # Sent nowhere: the preparation's own error (a push's 503), with every attempt.
                    error = not_sent[-1]
                    error.details = {**(error.details or {}), "attempts": failures}
                    raise error from exc
                raise UpstreamFailed(
                    f"no upstream answered: {'; '.join(f['upstream'] + ': ' + f['error'] for f in failures)}",
                    details={"attempts": failures},
                ) from exc
            asked.append(upstream)
            if tried is not None:
                tried.append(upstream.url)
            try:
                prepared = Prepared(body) if isinstance(body, bytes) else await body(upstream)
            except NotSent as skipped:
                not_sent.append(skipped.error)
                failures.append({"upstream": upstream.url, "error": skipped.error.message})
                continue
            try:
                return await self._attempt(upstream, prepared.body, stream=stream)
            except _Retry as retry:
                failures.append({"upstream": upstream.url, "error": retry.reason})
                _release(prepared)
            except BaseException:
                # No answer started (an error, a timeout, the client gone): nothing will take the rows.
                _release(prepared)
                raise

    async def _attempt(self, upstream: Upstream, body: bytes, *, stream: bool) -> UpstreamAnswer:
        stack = contextlib.AsyncExitStack()
        stack.enter_context(self._pool.lease(upstream))
        started = time.perf_counter()
        try:
            request = self._client.build_request(
                "POST", upstream.url + "/v1/chat/completions", content=body, headers=self._headers
            )
            response = await self._client.send(request, stream=True)
            stack.push_async_callback(response.aclose)
            if response.status_code >= 400:
                await self._refused(upstream, response)
            chunks = response.aiter_raw()
            if stream:
                first = await anext(chunks, b"")
            else:
                first = b"".join([chunk async for chunk in chunks])
        except _Retry:
            await stack.aclose()
            raise
        except httpx.TimeoutException as exc:
            await stack.aclose()
            self._metrics.upstream_requests.labels(upstream.url, "failed").inc()
            if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout):
                self._pool.mark_failed(upstream, f"no connection: {type(exc).__name__}")
                raise _Retry(f"no connection ({type(exc).__name__})") from None
            raise UpstreamTimeout(
                f"upstream {upstream.url} did not answer in time ({type(exc).__name__}); raise --upstream-timeout "
                "for answers that take longer",
                details={"upstream": upstream.url},
            ) from None
        except httpx.TransportError as exc:
            # Refused, reset or closed before the first byte: the server is gone or going; try another.
            await stack.aclose()
            self._metrics.upstream_requests.labels(upstream.url, "failed").inc()
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            self._pool.mark_failed(upstream, reason)
            raise _Retry(reason) from None
        except BaseException:
            await stack.aclose()
            raise
        self._metrics.upstream_requests.labels(upstream.url, "ok").inc()
        media_type = response.headers.get("content-type", "application/json")
        return UpstreamAnswer(
            upstream, media_type, first, chunks if stream else None, stack, time.perf_counter() - started
        )

    async def _refused(self, upstream: Upstream, response: httpx.Response) -> None:
        """Raise the upstream's error: retried elsewhere for 502/503, else with its status and message."""
        raw = b""
        async for chunk in response.aiter_raw():
            raw += chunk
            if len(raw) > _ERROR_BODY_BYTES:
                break
        status = response.status_code
        message, parsed = _error_message(raw)
        if status in _RETRIED_STATUSES:
            self._metrics.upstream_requests.labels(upstream.url, "failed").inc()
            raise _Retry(f"HTTP {status}: {message}")
        self._metrics.upstream_requests.labels(upstream.url, "error").inc()
        raise UpstreamRefused(
            status,
            message,
            details={"upstream": upstream.url, "upstream_status": status, "upstream_error": parsed},
        )


def _release(prepared: Prepared) -> None:
    if prepared.release is not None:
        prepared.release()


class _Retry(Exception):
    """This upstream could not start an answer; the next may."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _error_message(raw: bytes) -> tuple[str, Any]:
    """The upstream's message (OpenAI's and vLLM's ``{"error": {"message"}}``, or ``{"message"}``) and its
    parsed error object; the text itself when it is not JSON."""
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError:
        text = raw.decode("utf-8", "replace").strip()[:2000]
        return text or "(empty body)", None
    error = parsed.get("error", parsed) if isinstance(parsed, dict) else parsed
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"], error
    return str(parsed)[:2000], parsed
