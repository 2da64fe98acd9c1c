"""mmencode announcing itself to SGLang language servers, as SGLang's own encoder does.

SGLang 0.5.23's language-only servers keep a list of encoders (``sglang/srt/disaggregation/encoder/
receiver.py``: ``EncoderBootstrapServer``) beside their static ``--encoder-urls``: an encoder ``POST``s
``{"url": ...}`` to ``<bootstrap>/register_encoder_url`` and ``DELETE``s the same body at
``/unregister_encoder_url`` when it goes. A language server spreads each request's items over every
listed encoder, and probes their ``/health`` every 10 s (three failures evict one).

Where this differs from SGLang's own encoder (``http_server.py``), on purpose:

- it registers once the model is loaded and warm (SGLang's registers before it listens, so a language
  server may send it a request it cannot serve, and in ``zmq_to_scheduler`` mode SGLang 0.5.23's language
  server dies of an encoder's error: ``output_streamer.py:493``);
- it unregisters as soon as it stops taking work (a drain), before the work in flight finishes, and
  SGLang's own atexit hook does not run after a SIGTERM.

Registration is best effort: a bootstrap that cannot be reached is retried every ``retry_s`` for
``attempts`` tries, in the background, and never stops the service.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

import httpx

__all__ = ["EncoderRegistration"]

logger = logging.getLogger("mmencode.sglang")


class EncoderRegistration:
    def __init__(
        self,
        bootstraps: Sequence[str],
        url: str,
        *,
        retry_s: float = 5.0,
        attempts: int = 30,
        timeout_s: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.bootstraps = [bootstrap.rstrip("/") for bootstrap in bootstraps]
        self.url = url  # what the language servers dispatch to: this server's own URL
        self.retry_s = retry_s
        self.attempts = attempts
        # The bootstraps are the operator's servers, named by URL: no proxy from the environment.
        self._client = httpx.AsyncClient(timeout=timeout_s, transport=transport, trust_env=False)
        self._tasks: list[asyncio.Task[bool]] = []
        self.registered: set[str] = set()

    def start(self) -> None:
        """Register with every bootstrap, in the background (retried until it answers or gives up)."""
        self._tasks = [
            asyncio.create_task(self._register(bootstrap), name=f"mmencode-sglang-register-{bootstrap}")
            for bootstrap in self.bootstraps
        ]

    async def wait(self) -> bool:
        """True once every bootstrap has taken the registration (tests, and a start that must know)."""
        return all(await asyncio.gather(*self._tasks)) if self._tasks else True

    async def _register(self, bootstrap: str) -> bool:
        failure = ""
        for _ in range(self.attempts):
            try:
                answer = await self._client.post(bootstrap + "/register_encoder_url", json={"url": self.url})
            except httpx.HTTPError as exc:
                failure = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            else:
                if answer.status_code == 200:
                    self.registered.add(bootstrap)
                    logger.info("registered as SGLang encoder %s with %s", self.url, bootstrap)
                    return True
                failure = f"HTTP {answer.status_code}: {answer.text[:200]}"
            await asyncio.sleep(self.retry_s)
        logger.warning(
            "could not register as SGLang encoder %s with %s after %d tries (%s); it will not dispatch here",
            self.url,
            bootstrap,
            self.attempts,
            failure,
        )
        return False

    async def withdraw(self) -> None:
        """Unregister from every bootstrap that took the registration; registrations still being retried
        stop. Idempotent."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        for bootstrap in sorted(self.registered):
            try:
                answer = await self._client.request(
                    "DELETE", bootstrap + "/unregister_encoder_url", json={"url": self.url}, timeout=2.0
                )
                logger.info("unregistered SGLang encoder %s from %s (HTTP %d)", self.url, bootstrap, answer.status_code)
            except httpx.HTTPError as exc:
                logger.warning("could not unregister SGLang encoder %s from %s: %r", self.url, bootstrap, exc)
        self.registered.clear()

    async def aclose(self) -> None:
        await self.withdraw()
        await self._client.aclose()
