"""Single flight: one encode per cache key in a process, however many requests ask for it at once.

The first request that misses the cache for some keys starts a *flight*: a task of its own, apart from
any request, that encodes those items as one job and fills the cache. A request that misses the cache
for a key already in flight waits for that flight instead of encoding the item again.

A flight runs while any request waits for it. A request that leaves (its client disconnected, its
deadline passed) only stops waiting; the last one to leave cancels the flight, so work nobody waits
for is dropped as a lone request's work is (the worker drops a job cancelled before its forward).

A flight answers each of its keys with the rows (:class:`Landed`), or with the error that
item met, located at the item of the request that started it (each waiter relocates it to its own).
A key it gives no answer for was *abandoned*: another of its items failed first, or the flight was
cancelled as its last waiter left while a newcomer was joining. Whoever waited for such a key starts
a flight of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mmencode.app.engine.cache import CachedEmbedding

__all__ = ["Flight", "Flights", "Landed", "Outcome"]


@dataclass(frozen=True, slots=True)
class Landed:
    """A key's rows, and whether this process's encoder made them (or another replica's, read from the store)."""

    value: CachedEmbedding
    encoded: bool


# What a flight gives one key: its rows, or the error its item met.
Outcome = Landed | BaseException


class Flight:
    """One task encoding some keys, and how many requests wait for it."""

    def __init__(self, origin: Mapping[str, int], task: asyncio.Task[Mapping[str, Outcome]]) -> None:
        # Each key's item index in the request that started the flight, where its errors are located.
        self.origin = dict(origin)
        self.keys = tuple(origin)
        self.task = task
        self.waiters = 0

    def outcome(self, key: str) -> Outcome | None:
        """The key's rows or error once the flight has landed; ``None``: abandoned (ask again)."""
        if not self.task.done() or self.task.cancelled():
            return None
        error = self.task.exception()
        if error is not None:  # the work itself failed: every key shares its error
            return error
        return self.task.result().get(key)


class Flights:
    """The flights under way in this process, by key. Event-loop confined: no lock."""

    def __init__(self) -> None:
        self._by_key: dict[str, Flight] = {}

    def __len__(self) -> int:
        return len(self._by_key)

    def get(self, key: str) -> Flight | None:
        return self._by_key.get(key)

    def start(self, origin: Mapping[str, int], work: Coroutine[Any, Any, Mapping[str, Outcome]]) -> Flight:
        """A flight for the keys of ``origin`` (none of them in flight; each mapped to its item's index in
        the request that starts it) running ``work``."""
        flight = Flight(origin, asyncio.ensure_future(work))
        for key in flight.keys:
            assert key not in self._by_key, f"{key} is already in flight"
            self._by_key[key] = flight
        flight.task.add_done_callback(lambda _: self._forget(flight))
        return flight

    async def wait(self, flights: Iterable[Flight]) -> None:
        """Until every one of ``flights`` has landed. Leaving early (cancelled) stops waiting, and cancels
        the flights that no other request waits for."""
        waited = list(dict.fromkeys(flights))
        if not waited:
            return  # asyncio.wait refuses an empty set
        for flight in waited:
            flight.waiters += 1
        try:
            # asyncio.wait, unlike gather, leaves the tasks running when this waiter is cancelled.
            await asyncio.wait([flight.task for flight in waited])
        finally:
            for flight in waited:
                flight.waiters -= 1
                if flight.waiters == 0 and not flight.task.done():
                    self._forget(flight)  # nobody joins a flight that is being cancelled
                    flight.task.cancel()

    def _forget(self, flight: Flight) -> None:
        for key in flight.keys:
            if self._by_key.get(key) is flight:
                del self._by_key[key]
