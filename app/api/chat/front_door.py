"""The chat front door: ``POST /v1/chat/completions`` in front of OpenAI-compatible vLLM servers.

:class:`FrontDoor` holds what the route's service needs beyond the encoder: the upstreams
(:mod:`.upstreams`), the sender (:mod:`.forward`) and their HTTP client, built once per app.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from mmencode.app.api.chat.forward import UpstreamForwarder
from mmencode.app.api.chat.upstreams import UpstreamPool
from mmencode.app.config import Settings
from mmencode.app.metrics import Metrics

__all__ = ["FrontDoor"]

# Seconds to open a connection to an upstream: on a network that works, far less; past it, try another.
_CONNECT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class FrontDoor:
    pool: UpstreamPool
    forwarder: UpstreamForwarder
    client: httpx.AsyncClient

    @classmethod
    def build(cls, settings: Settings, metrics: Metrics) -> FrontDoor:
        headers: dict[str, str] = {}
        if settings.upstream_api_key is not None:
            headers["authorization"] = f"Bearer {settings.upstream_api_key.get_secret_value()}"
        client = httpx.AsyncClient(
            timeout=httpx.Timeout(settings.upstream_timeout, connect=_CONNECT_TIMEOUT_S),
            # As many connections as requests in flight: a pool limit would queue requests here, unseen.
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            # The upstreams are the operator's servers, named by URL: no proxy from the environment.
            trust_env=False,
        )
        pool = UpstreamPool(
            settings.upstream, client, metrics, health_interval_s=settings.upstream_health_interval, headers=headers
        )
        return cls(pool, UpstreamForwarder(pool, client, metrics, headers), client)

    async def aclose(self) -> None:
        await self.pool.aclose()
        await self.client.aclose()
