"""The worker batches across requests, isolates failures, bounds its queue and drops abandoned work."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from mmencode.app.engine.engine import batch_wait_seconds
from mmencode.app.engine.worker import EncoderWorker, QueueBytesFull, QueueFull, TokenDrift, prepared_nbytes
from mmencode.models import EncoderAdapter, EncoderOutput, PreparedItem, load_encoder
from tests.helpers import noise_image


@pytest.fixture(scope="module")
def adapter(checkpoints: dict[str, Path]) -> EncoderAdapter:
    return load_encoder(checkpoints["qwen2_vl"], device=torch.device("cpu"), dtype=torch.float32)


class RecordingAdapter:
    """The real adapter, with each forward's batch size recorded and an optional gate to hold it."""

    def __init__(self, inner: EncoderAdapter) -> None:
        self.inner = inner
        self.batches: list[int] = []
        self.gate = threading.Event()
        self.gate.set()

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def forward(self, items: Sequence[PreparedItem]) -> EncoderOutput:
        self.gate.wait(timeout=30)
        self.batches.append(len(items))
        return self.inner.forward(items)


def _worker(adapter: object, **overrides: float) -> EncoderWorker:
    options = {"max_batch_tokens": 10_000, "max_batch_items": 64, "batch_wait_s": 0.05, "max_queue": 64}
    options.update(overrides)
    return EncoderWorker(adapter, **options)  # type: ignore[arg-type]


def _prepared(adapter: EncoderAdapter, count: int) -> list[PreparedItem]:
    return [adapter.preprocess(noise_image(40 + 16 * i, 90 - 8 * i, seed=i)) for i in range(count)]


async def test_concurrent_requests_share_a_forward_and_match_unbatched(adapter: EncoderAdapter) -> None:
    recording = RecordingAdapter(adapter)
    worker = _worker(recording)
    worker.start()
    items = _prepared(adapter, 6)
    results = await asyncio.gather(*(worker.encode([item]) for item in items))
    await worker.drain(5)
    assert max(recording.batches) > 1, recording.batches
    for item, (rows,) in zip(items, results, strict=True):
        alone = adapter.forward([item]).rows
        assert rows.shape[0] == item.num_tokens
        torch.testing.assert_close(rows, alone, atol=1e-5, rtol=0)


async def test_batch_budgets_are_respected(adapter: EncoderAdapter) -> None:
    recording = RecordingAdapter(adapter)
    worker = _worker(recording, max_batch_items=2)
    worker.start()
    await asyncio.gather(*(worker.encode([item]) for item in _prepared(adapter, 5)))
    await worker.drain(5)
    assert max(recording.batches) <= 2 and sum(recording.batches) == 5


async def test_a_poisoned_request_fails_alone(adapter: EncoderAdapter) -> None:
    recording = RecordingAdapter(adapter)
    recording.gate.clear()  # hold the encoder so that every job lands in one batch
    worker = _worker(recording)
    worker.start()
    good = _prepared(adapter, 4)
    drifting = dataclasses.replace(good[0], num_tokens=good[0].num_tokens + 1)
    broken = dataclasses.replace(
        good[1], tensors={**good[1].tensors, "pixel_values": good[1].tensors["pixel_values"][:3]}
    )
    jobs = [
        worker.encode([good[0]]),
        worker.encode([drifting]),
        worker.encode([good[2], good[3]]),
        worker.encode([broken]),
    ]
    tasks = [asyncio.ensure_future(job) for job in jobs]
    await asyncio.sleep(0.2)
    recording.gate.set()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    await worker.drain(5)

    assert isinstance(outcomes[1], TokenDrift)
    assert outcomes[1].expected == [drifting.num_tokens] and outcomes[1].produced == [good[0].num_tokens]
    assert isinstance(outcomes[3], Exception) and not isinstance(outcomes[3], TokenDrift)
    for item, rows in zip([good[0], good[2], good[3]], [outcomes[0][0], *outcomes[2]], strict=True):  # type: ignore[index]
        torch.testing.assert_close(rows, adapter.forward([item]).rows, atol=1e-5, rtol=0)
    assert recording.batches[0] == 5  # the first forward held all five items
    assert worker.alive is False  # drained


async def test_full_queue_refuses_at_once(adapter: EncoderAdapter) -> None:
    recording = RecordingAdapter(adapter)
    recording.gate.clear()
    worker = _worker(recording, max_queue=1, batch_wait_s=0)
    worker.start()
    item = _prepared(adapter, 1)
    running = asyncio.ensure_future(worker.encode(item))
    await asyncio.sleep(0.1)  # taken by the worker, stuck in the gate
    queued = asyncio.ensure_future(worker.encode(item))
    await asyncio.sleep(0.05)
    with pytest.raises(QueueFull):
        await worker.encode(item)
    recording.gate.set()
    await asyncio.gather(running, queued)
    await worker.drain(5)


async def test_the_inputs_waiting_for_the_encoder_stay_within_their_byte_budget(adapter: EncoderAdapter) -> None:
    """Preprocessed inputs (a video's frames, a large image's patches) are held until their forward ends:
    past ``max_queue_bytes`` a request is refused, and the gauge's figure is what the items hold."""
    recording = RecordingAdapter(adapter)
    recording.gate.clear()
    items = _prepared(adapter, 3)
    sizes = [prepared_nbytes(item) for item in items]
    assert all(size > 0 for size in sizes)
    worker = _worker(recording, batch_wait_s=0, max_queue_bytes=sizes[0] + sizes[1])
    worker.start()
    running = asyncio.ensure_future(worker.encode([items[0]]))
    await asyncio.sleep(0.1)  # in the forward, stuck in the gate: its inputs are still held
    queued = asyncio.ensure_future(worker.encode([items[1]]))
    await asyncio.sleep(0.05)
    assert worker.queue_bytes == sizes[0] + sizes[1]
    with pytest.raises(QueueBytesFull) as refused:
        await worker.encode([items[2]])
    assert (refused.value.queued_bytes, refused.value.job_bytes) == (sizes[0] + sizes[1], sizes[2])
    recording.gate.set()
    await asyncio.gather(running, queued)
    assert worker.queue_bytes == 0
    # A request alone is taken whatever its size: the budget bounds what waits beside others.
    alone = _worker(RecordingAdapter(adapter), batch_wait_s=0, max_queue_bytes=1)
    alone.start()
    assert len(await alone.encode(items)) == 3 and alone.queue_bytes == 0
    await worker.drain(5)
    await alone.drain(5)


async def test_abandoned_requests_never_reach_the_encoder(adapter: EncoderAdapter) -> None:
    recording = RecordingAdapter(adapter)
    recording.gate.clear()
    worker = _worker(recording, batch_wait_s=0)
    worker.start()
    items = _prepared(adapter, 3)
    first = asyncio.ensure_future(worker.encode([items[0]]))
    await asyncio.sleep(0.1)
    abandoned = asyncio.ensure_future(worker.encode([items[1], items[2]]))
    await asyncio.sleep(0.05)
    abandoned.cancel()  # the request's deadline passed while it waited
    recording.gate.set()
    await first
    await worker.drain(5)
    assert recording.batches == [1]


async def test_requests_being_preprocessed_hold_their_place_in_the_queue(adapter: EncoderAdapter) -> None:
    # Admission happens before decoding, so an overloaded service refuses before spending CPU.
    worker = _worker(RecordingAdapter(adapter), max_queue=2, batch_wait_s=0)
    worker.start()
    first, second = worker.reserve(), worker.reserve()
    assert worker.queue_depth == 2
    with pytest.raises(QueueFull):
        worker.reserve()
    second.release()
    second.release()  # twice is harmless
    assert worker.queue_depth == 1
    rows = await worker.encode(_prepared(adapter, 1), first)
    assert len(rows) == 1 and worker.queue_depth == 0  # its forward began: the place is free
    with worker.reserve():
        assert worker.queue_depth == 1
    assert worker.queue_depth == 0
    await worker.drain(5)


async def test_a_batch_waits_for_requests_being_preprocessed(adapter: EncoderAdapter) -> None:
    # Under load, the forward takes the requests still on their way instead of running nearly empty.
    recording = RecordingAdapter(adapter)
    worker = _worker(recording, batch_wait_s=30)
    worker.start()
    first_item, second_item = _prepared(adapter, 2)
    on_its_way = worker.reserve()  # a request being decoded
    first = asyncio.ensure_future(worker.encode([first_item]))
    await asyncio.sleep(0.2)
    assert not first.done() and recording.batches == []
    second = await worker.encode([second_item], on_its_way)
    assert len(second) == 1 and len(await first) == 1
    assert recording.batches == [2]
    await worker.drain(5)


async def test_a_lone_request_does_not_wait_for_the_batch(adapter: EncoderAdapter) -> None:
    # Nothing else is being preprocessed: waiting could not fill the batch, so it starts at once.
    recording = RecordingAdapter(adapter)
    worker = _worker(recording, batch_wait_s=30)
    worker.start()
    async with asyncio.timeout(10):
        rows = await worker.encode(_prepared(adapter, 1))
    assert len(rows) == 1 and recording.batches == [1]
    # A request that fails while being preprocessed ends the wait for it.
    on_its_way = worker.reserve()
    waiting = asyncio.ensure_future(worker.encode(_prepared(adapter, 1)))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    on_its_way.release()
    async with asyncio.timeout(10):
        assert len(await waiting) == 1
    assert recording.batches == [1, 1]
    await worker.drain(5)


@pytest.mark.parametrize(
    ("configured_ms", "beside", "expected_s"),
    [(None, True, 0.020), (None, False, 0.002), (0.0, True, 0.0), (5.0, False, 0.005)],
)
def test_batches_wait_longer_beside_preprocessing_by_default(
    configured_ms: float | None, beside: bool, expected_s: float
) -> None:
    # A small tower's forward on one CPU thread takes its fixed cost from preprocessing's cores;
    # a forward that takes turns with preprocessing, or runs on a GPU, gains nothing from waiting.
    assert batch_wait_seconds(configured_ms, forward_beside_preprocessing=beside) == pytest.approx(expected_s)
