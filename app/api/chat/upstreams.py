"""The LLM servers behind the front door: their health, their models, their load, and which one to ask.

The choice, per request (:meth:`UpstreamPool.choose`):

1. **model**: upstreams whose ``/v1/models`` lists the request's ``model`` (any, without one);
2. **load**: the fewest requests in flight from this process (not round robin, which piles long
   requests onto one server: vllm#52484);
3. **affinity**: among those, the one that recently received one of the request's images, so that its
   encoder and prefix caches are warm; then the one chosen longest ago.

An upstream leaves the rotation when its health check fails, or at once when a request to it fails to
connect or loses its connection; the next health check that passes brings it back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import httpx

from mmencode.app.api.chat.errors import UpstreamUnavailable
from mmencode.app.engine.errors import ModelNotFound
from mmencode.app.metrics import Metrics

__all__ = ["Upstream", "UpstreamPool"]

logger = logging.getLogger("mmencode.upstream")

# Images remembered for affinity: a hash and a URL each, a few MB at most.
_AFFINITY_ENTRIES = 65536
_HEALTH_TIMEOUT_S = 3.0


@dataclass(eq=False)
class Upstream:
    url: str
    # None until the first health check answers: tried (a request that fails takes it out at once).
    healthy: bool | None = None
    models: tuple[str, ...] = ()
    in_flight: int = 0
    last_chosen: float = 0.0
    last_error: str | None = field(default=None, repr=False)

    def serves(self, model: str | None) -> bool:
        # Before its model list is known, an upstream may serve anything.
        return model is None or not self.models or model in self.models


class UpstreamPool:
    def __init__(
        self,
        urls: Sequence[str],
        client: httpx.AsyncClient,
        metrics: Metrics,
        *,
        health_interval_s: float,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.upstreams = [Upstream(url) for url in urls]
        self._client = client
        self._metrics = metrics
        self._interval = health_interval_s
        self._headers = headers or {}
        self._affinity: OrderedDict[str, Upstream] = OrderedDict()
        self._checks: asyncio.Task[None] | None = None
        for upstream in self.upstreams:
            metrics.upstream_healthy.labels(upstream.url).set(0)
            metrics.upstream_in_flight.labels(upstream.url).set(0)

    # ----- lifecycle -----
    def start(self) -> None:
        self._checks = asyncio.create_task(self._check_forever(), name="mmencode-upstream-health")

    async def aclose(self) -> None:
        if self._checks is not None:
            self._checks.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checks

    async def _check_forever(self) -> None:
        while True:
            await self.check_all()
            await asyncio.sleep(self._interval)

    async def check_all(self) -> None:
        await asyncio.gather(*(self._check(upstream) for upstream in self.upstreams))

    async def _check(self, upstream: Upstream) -> None:
        """``/health`` (vLLM's engine is alive), then ``/v1/models`` (what it serves)."""
        try:
            health = await self._client.get(upstream.url + "/health", timeout=_HEALTH_TIMEOUT_S)
            health.raise_for_status()
            listed = await self._client.get(
                upstream.url + "/v1/models", headers=self._headers, timeout=_HEALTH_TIMEOUT_S
            )
            listed.raise_for_status()
            models = tuple(str(card["id"]) for card in listed.json()["data"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            self.mark_failed(upstream, f"health check failed: {_describe(exc)}")
            return
        upstream.models = models
        if upstream.healthy is not True:
            logger.info("upstream %s is in the rotation, serving %s", upstream.url, ", ".join(models) or "no model")
        upstream.healthy, upstream.last_error = True, None
        self._metrics.upstream_healthy.labels(upstream.url).set(1)

    def mark_failed(self, upstream: Upstream, reason: str) -> None:
        """Out of the rotation until a health check passes."""
        if upstream.healthy is not False:
            logger.warning("upstream %s leaves the rotation: %s", upstream.url, reason)
        upstream.healthy, upstream.last_error = False, reason
        self._metrics.upstream_healthy.labels(upstream.url).set(0)

    # ----- choosing -----
    def models(self) -> list[str]:
        """Every model an upstream has listed, in upstream order, each once."""
        return list(dict.fromkeys(model for upstream in self.upstreams for model in upstream.models))

    def require(self, model: str | None) -> None:
        """Raise unless an upstream in the rotation serves ``model``: 404 if none serves it, 503 if none is up."""
        self._candidates(model, exclude=())

    def choose(self, model: str | None, hashes: Sequence[str], exclude: Sequence[Upstream] = ()) -> Upstream:
        """The upstream for a request (module docstring); ``exclude``: those that already failed it."""
        candidates = self._candidates(model, exclude)
        least = min(u.in_flight for u in candidates)
        lightest = [u for u in candidates if u.in_flight == least]
        warm = self._warmest(lightest, hashes)
        if warm is not None:
            self._metrics.upstream_affinity_hits.inc()
            chosen = warm
        else:
            chosen = min(lightest, key=lambda u: u.last_chosen)
        chosen.last_chosen = time.monotonic()
        return chosen

    def _candidates(self, model: str | None, exclude: Sequence[Upstream]) -> list[Upstream]:
        serving = [u for u in self.upstreams if u.serves(model)]
        if not serving:
            available = self.models()
            raise ModelNotFound(
                f"model {model!r} is not served by any upstream; they serve {available}",
                param="model",
                details={"requested": model, "available": available},
            )
        candidates = [u for u in serving if u.healthy is not False and u not in exclude]
        if not candidates:
            raise UpstreamUnavailable(
                f"no upstream serving {model or 'the request'} is available: "
                + "; ".join(f"{u.url}: {u.last_error or 'already tried'}" for u in serving),
                details={"upstreams": [{"url": u.url, "error": u.last_error} for u in serving]},
                headers={"Retry-After": str(max(1, round(self._interval)))},
            )
        return candidates

    def _warmest(self, candidates: Sequence[Upstream], hashes: Sequence[str]) -> Upstream | None:
        """The candidate that received the most of these images recently, if any did."""
        votes: dict[int, int] = {}
        for item_hash in hashes:
            holder = self._affinity.get(item_hash)
            if holder is not None and holder in candidates:
                votes[id(holder)] = votes.get(id(holder), 0) + 1
        if not votes:
            return None
        return max(candidates, key=lambda u: votes.get(id(u), 0))

    def remember(self, upstream: Upstream, hashes: Sequence[str]) -> None:
        """``upstream`` now holds these images (it answered a request carrying them)."""
        for item_hash in hashes:
            self._affinity[item_hash] = upstream
            self._affinity.move_to_end(item_hash)
        while len(self._affinity) > _AFFINITY_ENTRIES:
            self._affinity.popitem(last=False)

    @contextlib.contextmanager
    def lease(self, upstream: Upstream) -> Iterator[None]:
        """Count a request in flight on ``upstream`` for as long as it is being answered."""
        upstream.in_flight += 1
        self._metrics.upstream_in_flight.labels(upstream.url).inc()
        try:
            yield
        finally:
            upstream.in_flight -= 1
            self._metrics.upstream_in_flight.labels(upstream.url).dec()

    def status(self) -> list[dict[str, object]]:
        """For /ready: each upstream's state."""
        return [
            {
                "url": u.url,
                "healthy": u.healthy,
                "models": list(u.models),
                "in_flight": u.in_flight,
                "error": u.last_error,
            }
            for u in self.upstreams
        ]


def _describe(exc: BaseException) -> str:
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code}"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
