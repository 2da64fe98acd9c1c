"""Single flight in a process: concurrent requests for the same content share one encode.

The fake adapter and worker of test_scheduler.py, with a worker that holds every job until the test lets
it go, so that the requests' timing is the test's, not the event loop's.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch

from mmencode.app.engine.errors import InvalidImage, TokenCountMismatch
from mmencode.app.engine.scheduler import Scheduler
from mmencode.app.engine.types import ImageItem, ItemResult
from mmencode.app.engine.worker import TokenDrift
from mmencode.models import PreparedItem
from tests.unit.engine.test_scheduler import FakeWorker, png, precomputed, scheduler
from tests.unit.engine.test_scheduler import pool as pool  # the fixture


class GatedWorker(FakeWorker):
    """Holds each job until ``gate`` is set; counts the jobs cancelled while held."""

    def __init__(self, *, drift: int = 0) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.held = 0
        self.cancelled = 0
        self.drift_rows = drift

    async def encode(self, items: Sequence[PreparedItem], reservation: object = None) -> list[torch.Tensor]:
        self.held += 1
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.jobs.append(len(items))
        if self.drift_rows:
            expected = [item.num_tokens for item in items]
            produced = [n + self.drift_rows for n in expected]
            raise TokenDrift(expected, sum(produced), produced)
        return [item.tensors["pixel_values"].clone() for item in items]


async def _until(condition: Callable[[], bool]) -> None:
    """Until ``condition`` holds (at most about 5 s)."""
    for _ in range(5000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the condition never held")


def _metric(engine: Scheduler, sample: str) -> float:
    for line in engine.metrics.render().decode().splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_32_concurrent_requests_for_one_new_image_encode_it_once_and_are_answered_together(
    pool: ThreadPoolExecutor,
) -> None:
    async def run() -> None:
        worker = GatedWorker()
        engine = scheduler(pool, worker)
        image = png(48, 32, 77)
        requests = [asyncio.create_task(engine.encode([ImageItem(file=image)])) for _ in range(32)]
        await _until(lambda: worker.held == 1)
        await asyncio.sleep(0.05)  # every request has looked and joined by now
        assert worker.held == 1 and not any(r.done() for r in requests)  # nobody answered before the encode
        worker.gate.set()
        answers = await asyncio.gather(*requests)
        results = [answer[0] for answer in answers]
        assert worker.jobs == [1]
        assert sorted(r.source for r in results).count("encoder") == 1
        assert {r.hash for r in results} == {results[0].hash}
        assert all(torch.equal(r.rows, results[0].rows) for r in results)
        assert _metric(engine, "mmencode_inflight_coalesced_total") == 31
        assert _metric(engine, 'mmencode_items_total{source="encoder"}') == 1
        assert len(engine.flights) == 0

    asyncio.run(run())


def test_an_encoder_error_reaches_every_waiter_at_its_own_item(pool: ThreadPoolExecutor) -> None:
    async def run() -> None:
        worker = GatedWorker(drift=1)
        engine = scheduler(pool, worker)
        image = png(32, 32, 5)
        first = asyncio.create_task(engine.encode([ImageItem(file=image)]))
        await _until(lambda: worker.held == 1)
        # Its item 0 is precomputed ("fill"): the shared item is its item 1.
        second = asyncio.create_task(engine.encode([precomputed(2), ImageItem(file=image)], "fill"))
        await asyncio.sleep(0.05)
        worker.gate.set()
        owner, waiter = await asyncio.gather(first, second, return_exceptions=True)
        assert worker.jobs == [1]
        assert isinstance(owner, TokenCountMismatch) and isinstance(waiter, TokenCountMismatch)
        assert owner.details is not None and owner.details["items"] == [{"index": 0, "expected": 4, "produced": 5}]
        assert waiter.details is not None and waiter.details["items"] == [{"index": 1, "expected": 4, "produced": 5}]
        assert "item 1" in waiter.message and waiter is not owner

    asyncio.run(run())


def test_a_preprocessing_error_is_located_at_each_waiters_own_index(pool: ThreadPoolExecutor) -> None:
    async def run() -> None:
        worker = GatedWorker()
        engine = scheduler(pool, worker)
        release = threading.Event()
        prepare = engine._prepare

        def slow_prepare(pending: object) -> PreparedItem:
            release.wait(5)
            return prepare(pending)  # type: ignore[arg-type]

        engine._prepare = slow_prepare  # type: ignore[method-assign]
        not_an_image = b"GIF89a but not really an image"
        owner = asyncio.create_task(engine.encode([ImageItem(file=not_an_image)]))
        await asyncio.sleep(0.05)
        waiter = asyncio.create_task(engine.encode([ImageItem(file=png(16, 16, 3)), ImageItem(file=not_an_image)]))
        await asyncio.sleep(0.05)
        release.set()
        worker.gate.set()
        first, second = await asyncio.gather(owner, waiter, return_exceptions=True)
        assert isinstance(first, InvalidImage) and isinstance(second, InvalidImage)
        assert first.location is not None and (first.location.index, first.location.field) == (0, ("image",))
        assert second.location is not None and (second.location.index, second.location.field) == (1, ("image",))
        assert _metric(engine, "mmencode_inflight_coalesced_total") == 0

    asyncio.run(run())


def test_a_waiter_that_leaves_does_not_cancel_the_encode_others_wait_for(pool: ThreadPoolExecutor) -> None:
    async def run() -> None:
        worker = GatedWorker()
        engine = scheduler(pool, worker)
        image = png(32, 48, 40)
        owner = asyncio.create_task(engine.encode([ImageItem(file=image)]))
        await _until(lambda: worker.held == 1)
        waiter = asyncio.create_task(engine.encode([ImageItem(file=image)]))
        await asyncio.sleep(0.02)
        owner.cancel()  # the client that started the encode disconnects
        await asyncio.sleep(0.02)
        assert worker.cancelled == 0
        worker.gate.set()
        (result,) = await waiter
        assert result.source == "cache" and worker.jobs == [1]
        # Cached now: a later request is a plain hit.
        (again,) = await engine.encode([ImageItem(file=image)])
        assert again.source == "cache" and worker.jobs == [1]

    asyncio.run(run())


def test_when_the_last_waiter_leaves_the_encode_is_cancelled(pool: ThreadPoolExecutor) -> None:
    async def run() -> None:
        worker = GatedWorker()
        engine = scheduler(pool, worker)
        image = png(32, 48, 41)
        requests = [asyncio.create_task(engine.encode([ImageItem(file=image)])) for _ in range(3)]
        await _until(lambda: worker.held == 1)
        await asyncio.sleep(0.02)
        for request in requests:
            request.cancel()
        await asyncio.gather(*requests, return_exceptions=True)
        await _until(lambda: worker.cancelled == 1)
        assert len(engine.flights) == 0 and worker.jobs == []
        # The next request starts afresh.
        worker.gate.set()
        (result,) = await engine.encode([ImageItem(file=image)])
        assert result.source == "encoder" and worker.jobs == [1]

    asyncio.run(run())


def test_an_item_abandoned_by_a_failed_request_is_encoded_by_its_waiter(pool: ThreadPoolExecutor) -> None:
    """The first request fails on its other item before anything is encoded; the request that waited for
    its good item does not inherit that failure: it encodes the item itself."""

    async def run() -> None:
        worker = GatedWorker()
        engine = scheduler(pool, worker)
        release = threading.Event()
        prepare = engine._prepare

        def slow_prepare(pending: object) -> PreparedItem:
            release.wait(5)
            return prepare(pending)  # type: ignore[arg-type]

        engine._prepare = slow_prepare  # type: ignore[method-assign]
        good = png(32, 32, 50)
        owner = asyncio.create_task(engine.encode([ImageItem(file=good), ImageItem(file=b"not an image")]))
        await asyncio.sleep(0.05)
        waiter = asyncio.create_task(engine.encode([ImageItem(file=good)]))
        await asyncio.sleep(0.05)
        release.set()
        worker.gate.set()
        failed, answered = await asyncio.gather(owner, waiter, return_exceptions=True)
        assert isinstance(failed, InvalidImage) and failed.location is not None and failed.location.index == 1
        assert isinstance(answered, list)
        result: ItemResult = answered[0]
        assert result.source == "encoder" and worker.jobs == [1]

    asyncio.run(run())


@pytest.mark.parametrize("scopes", [("a", "b"), (None, "b")])
def test_cache_scopes_share_neither_rows_nor_flights(pool: ThreadPoolExecutor, scopes: tuple[str | None, str]) -> None:
    async def run() -> None:
        worker = GatedWorker()
        worker.gate.set()
        engine = scheduler(pool, worker)
        image = png(32, 32, 60)
        one, other = scopes
        (first,) = await engine.encode([ImageItem(file=image)], scope=one)
        (again,) = await engine.encode([ImageItem(hash=first.hash)], scope=one)
        assert again.source == "cache"
        with pytest.raises(Exception) as refused:
            await engine.encode([ImageItem(hash=first.hash)], scope=other)
        assert getattr(refused.value, "code", None) == "unknown_hash"
        (theirs,) = await engine.encode([ImageItem(file=image)], scope=other)
        assert theirs.source == "encoder" and theirs.hash == first.hash  # the hash stays the content's
        assert worker.jobs == [1, 1]

    asyncio.run(run())


def test_a_flight_that_lands_while_a_request_asks_the_store_answers_it_from_the_cache(
    pool: ThreadPoolExecutor,
) -> None:
    """The soak's 500: a request missed the local cache, and while it waited for the shared store's answer
    the flight for its item landed (filling the local cache, leaving the table). It then had nothing to
    join and nothing to encode, and asyncio.wait refused the empty set."""

    async def run() -> None:
        worker = GatedWorker()
        engine = scheduler(pool, worker)
        image = png(48, 32, 78)
        first = asyncio.create_task(engine.encode([ImageItem(file=image)]))
        await _until(lambda: worker.held == 1)
        lookup = engine.cache.get_many
        asked = asyncio.Event()

        async def slow_store(keys: list[str]) -> list[Any]:
            hits = await lookup(keys)  # a miss: the flight has not landed yet
            asked.set()
            await _until(lambda: len(engine.flights) == 0)  # ... and lands before the store answers
            return hits

        engine.cache.get_many = slow_store  # type: ignore[method-assign]
        second = asyncio.create_task(engine.encode([ImageItem(file=image)]))
        await asked.wait()
        worker.gate.set()
        answers = await asyncio.gather(first, second)
        assert worker.jobs == [1]
        assert answers[1][0].source == "cache"
        assert torch.equal(answers[0][0].rows, answers[1][0].rows)

    asyncio.run(run())
