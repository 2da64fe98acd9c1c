"""Leases across replicas: one encode per item among all the replicas that share a store.

Before a replica encodes items that missed every cache, it takes a lease on each item's key in the
shared store (``SET <value key>:lease <token> NX PX <ttl>``, one round trip for the request's items).
The holder encodes, writes the value as every encoded item is written, and only then drops the lease.
A replica that finds a lease taken waits for the value instead, asking the store every 10-100 ms, in one
atomic step per key: while the lease is there, wait; once it is gone, the value is the answer, or, with
no value (the holder died and its lease expired, or its encode failed), this replica takes the lease and
encodes. Past ``wait_s`` it encodes for itself. The holder renews its leases every third of their TTL
while it works, so the TTL bounds how long a holder that died delays the others, not how long an encode
may take.

The lease is an optimisation, as the tier is: a store that is down, slow or restarted (its leases lost)
means each replica encodes for itself, and no request fails because of a lease. Taking or polling leases
is on a request's path, so each round trip is bounded by ``_ROUND_TRIP_S`` (or the tier's timeout, if
shorter) whatever ``--shared-cache-timeout`` allows the background writes: a store that answers reads
but stalls writes (full, paused, failing over) then rests the leases alone for a while, not the tier.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from mmencode.app.engine.cache.local import CachedEmbedding
from mmencode.app.engine.cache.shared import SharedCache
from mmencode.app.metrics import Metrics

__all__ = ["Claim", "LeaseResult", "Leases"]

logger = logging.getLogger("mmencode.cache")

# What became of an item's lease, for mmencode_shared_lease_total: this replica leased it and encodes
# (acquired); another replica's value answered it (waited); its holder vanished and this replica took the
# lease over (took_over); the wait ran out (gave_up) or the store could not be asked (unavailable), and
# this replica encodes without one.
LeaseResult = Literal["acquired", "waited", "took_over", "gave_up", "unavailable"]

_POLL_FIRST_S = 0.01
_POLL_MAX_S = 0.1
_ROUND_TRIP_S = 0.25  # the longest a request waits for the store to take or poll its leases

# KEYS[1] the lease, KEYS[2] the value; ARGV[1] this replica's token, ARGV[2] the TTL in ms.
# 0: leased by another, wait; the value: its holder is done; 1: nobody holds it and there is no value,
# the lease is now ours. Atomic, so a holder's write (before its release) is never missed.
_POLL = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local value = redis.call('GET', KEYS[2])
if value then return value end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
# Only the holder drops or renews its lease: one that expired may be another replica's by now.
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
_RENEW = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0"


@dataclass(frozen=True, slots=True)
class Claim:
    """A group of keys split by who encodes them: ``ours`` now (leased, or unleased where the store could not
    say), ``theirs`` another replica, whose values :meth:`Leases.wait` waits for."""

    ours: list[str]
    theirs: list[str]


class Leases:
    """The leases of one process (one random token) on the keys of a :class:`SharedCache`."""

    def __init__(
        self,
        shared: SharedCache,
        *,
        ttl_s: float,
        wait_s: float,
        metrics: Metrics,
        round_trip_s: float = _ROUND_TRIP_S,
    ) -> None:
        self.shared = shared
        self.round_trip_s = round_trip_s
        self._resting_until = 0.0  # after a round trip that timed out: leases skipped, the tier still used
        self._stalling = False
        self.ttl_ms = max(1, round(ttl_s * 1000))
        self.wait_s = wait_s
        self.metrics = metrics
        self._token = uuid.uuid4().hex
        self._held: set[str] = set()
        self._poll = shared.client.register_script(_POLL)
        self._release = shared.client.register_script(_RELEASE)
        self._renew = shared.client.register_script(_RENEW)
        self._renewing: asyncio.Task[None] | None = None
        self._releasing: set[asyncio.Task[None]] = set()

    def lease_key(self, key: str) -> str:
        return self.shared.key(key) + ":lease"

    @property
    def held(self) -> frozenset[str]:
        return frozenset(self._held)

    def _count(self, result: LeaseResult, count: int = 1) -> None:
        if count:
            self.metrics.shared_leases.labels(result).inc(count)

    # ----- taking leases -----
    async def claim(self, keys: list[str]) -> Claim:
        """Lease what nobody holds; the rest is another replica's. Never raises: a store that cannot be
        asked leaves every key to this replica, unleased."""
        taken = await self._take(keys)
        if taken is None:
            self._count("unavailable", len(keys))
            return Claim(list(keys), [])
        ours = [key for key in keys if key in taken]
        self._count("acquired", len(ours))
        return Claim(ours, [key for key in keys if key not in taken])

    async def _take(self, keys: list[str]) -> set[str] | None:
        """The keys of ``keys`` now leased here; None when the store cannot be asked."""
        if not keys:
            return set()
        if not self._available:
            return None
        try:
            async with asyncio.timeout(self.round_trip_s), self.shared.client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.set(self.lease_key(key), self._token, nx=True, px=self.ttl_ms)
                answers = await pipe.execute()
        except Exception as exc:
            self._failed(exc)
            return None
        self._succeeded()
        taken = {key for key, answer in zip(keys, answers, strict=True) if answer}
        self._hold(taken)
        return taken

    async def wait(self, keys: list[str]) -> tuple[dict[str, CachedEmbedding], list[str]]:
        """Wait for other replicas' values of ``keys``: the values that arrived, and the keys this replica
        must encode now (leases taken over, or unleased when the wait ran out or the store failed)."""
        found: dict[str, CachedEmbedding] = {}
        encode: list[str] = []
        waiting = list(keys)
        deadline = time.monotonic() + self.wait_s
        delay = _POLL_FIRST_S
        while waiting:
            if time.monotonic() >= deadline:
                self._count("gave_up", len(waiting))
                encode += waiting
                break
            answers = await self._ask(waiting)
            if answers is None:
                self._count("unavailable", len(waiting))
                encode += waiting
                break
            still: list[str] = []
            done: list[str] = []
            blobs: list[bytes | None] = []
            for key, answer in zip(waiting, answers, strict=True):
                if isinstance(answer, bytes):
                    done.append(key)
                    blobs.append(answer)
                elif answer == 1:
                    self._hold({key})
                    self._count("took_over")
                    encode.append(key)
                else:
                    still.append(key)
            values = await self.shared.decode(done, blobs)
            unreadable = []
            for key, value in zip(done, values, strict=True):
                if value is None:
                    unreadable.append(key)  # a foreign or corrupt value left there: encode it again
                else:
                    found[key] = value
                    self._count("waited")
            if unreadable:
                taken = await self._take(unreadable) or set()
                self._count("took_over", len(taken))
                self._count("unavailable", len(unreadable) - len(taken))
                encode += unreadable
            waiting = still
            if waiting:
                await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
                delay = min(delay * 2, _POLL_MAX_S)
        return found, encode

    async def _ask(self, keys: list[str]) -> list[Any] | None:
        """One poll of ``keys`` (``_POLL``'s answers, in order); None when the store cannot be asked."""
        if not self._available:
            return None
        try:
            async with asyncio.timeout(self.round_trip_s), self.shared.client.pipeline(transaction=False) as pipe:
                for key in keys:
                    await self._poll(
                        keys=[self.lease_key(key), self.shared.key(key)], args=[self._token, self.ttl_ms], client=pipe
                    )
                answers = await pipe.execute()
        except Exception as exc:
            self._failed(exc)
            return None
        self._succeeded()
        return list(answers)

    @property
    def _available(self) -> bool:
        return self.shared.available and time.monotonic() >= self._resting_until

    def _failed(self, exc: Exception) -> None:
        """A round trip that timed out rests the leases alone (the store may still serve reads and take
        writes in the background); any other failure is the tier's."""
        if not isinstance(exc, TimeoutError):
            self.shared.failed("lease", exc)
            return
        self.metrics.shared_cache_errors.labels("lease").inc()
        self._resting_until = time.monotonic() + self.shared.retry_after_s
        if not self._stalling:
            self._stalling = True
            logger.warning(
                "shared cache %s took over %gs to take or poll leases; each replica encodes what it misses "
                "(no single flight across replicas), retrying every %.0fs",
                self.shared.location,
                self.round_trip_s,
                self.shared.retry_after_s,
            )

    def _succeeded(self) -> None:
        self.shared.succeeded()
        if self._stalling:
            self._stalling = False
            logger.info("shared cache %s takes leases again", self.shared.location)

    # ----- holding and dropping them -----
    def _hold(self, keys: Iterable[str]) -> None:
        self._held.update(keys)
        if self._held and (self._renewing is None or self._renewing.done()):
            self._renewing = asyncio.create_task(self._renew_held(), name="mmencode-lease-renewal")

    async def _renew_held(self) -> None:
        """Every third of the TTL while leases are held: each held lease lives a TTL more."""
        while self._held:
            await asyncio.sleep(self.ttl_ms / 3000)
            held = sorted(self._held)
            if not held or not self.shared.available:
                continue
            try:
                async with self.shared.client.pipeline(transaction=False) as pipe:
                    for key in held:
                        await self._renew(keys=[self.lease_key(key)], args=[self._token, self.ttl_ms], client=pipe)
                    await pipe.execute()
            except Exception as exc:  # the lease may lapse: at worst another replica encodes too
                self.shared.failed("lease", exc)

    def release(self, keys: Iterable[str]) -> None:
        """Drop this replica's leases of ``keys`` once their values' writes have ended (a waiter that sees
        the lease gone finds the value), in the background. Keys not held here are ignored."""
        mine = [key for key in keys if key in self._held]
        if not mine:
            return
        task = asyncio.create_task(self._drop(mine), name="mmencode-lease-release")
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def _drop(self, keys: list[str]) -> None:
        try:
            await asyncio.gather(*(self.shared.written(key) for key in keys))
            if self.shared.available:
                async with self.shared.client.pipeline(transaction=False) as pipe:
                    for key in keys:
                        await self._release(keys=[self.lease_key(key)], args=[self._token], client=pipe)
                    await pipe.execute()
        except Exception as exc:  # the leases expire by themselves
            self.shared.failed("lease", exc)
        finally:
            self._held.difference_update(keys)

    async def aclose(self, grace_s: float = 2.0) -> None:
        """Drop the leases being released (for at most ``grace_s``), stop renewing the rest."""
        if self._releasing:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace_s):
                    await asyncio.gather(*self._releasing, return_exceptions=True)
        if self._renewing is not None:
            self._renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewing
