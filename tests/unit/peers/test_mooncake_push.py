"""A Mooncake push against an in-process consumer (tests.helpers.FakeConsumer: vLLM 0.32's control protocol,
a receive pool registered with a real Mooncake engine): what lands, and what every failure undoes.

The same pushes into a real vLLM consumer: tests/vllm_server/test_mooncake.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from mmencode.app.metrics import Metrics
from mmencode.app.peers.vllm.mooncake.control import ControlChannel
from mmencode.app.peers.vllm.mooncake.errors import EncoderCachePushFailed
from mmencode.app.peers.vllm.mooncake.push import MooncakePusher, Transfer
from mmencode.app.peers.vllm.mooncake.transfer import MooncakeTransfer, MooncakeUnavailable, require_mooncake
from tests.helpers import FakeConsumer, free_port


@pytest.fixture(scope="module")
def shared_consumer() -> Iterator[FakeConsumer]:
    with FakeConsumer(shards=2) as fake:  # two tensor-parallel shards
        yield fake


@pytest.fixture
def consumer(shared_consumer: FakeConsumer) -> FakeConsumer:
    shared_consumer.reset()
    return shared_consumer


@pytest.fixture(scope="module")
def transfer() -> Iterator[MooncakeTransfer]:
    engine = MooncakeTransfer("127.0.0.1", "tcp")
    yield engine
    engine.close()


@pytest.fixture
async def pusher(consumer: FakeConsumer, transfer: MooncakeTransfer) -> AsyncIterator[MooncakePusher]:
    """Closed before the consumer is reset: the cancels still under way reach it."""
    push = MooncakePusher(
        transfer,
        ControlChannel(timeout_s=0.5),
        Metrics(),
        timeout_s=5.0,
        executor=ThreadPoolExecutor(max_workers=2),
    )
    yield push
    # Not aclose(), which stops the engine the module's pushers share: the cancels, then the sockets.
    await _settled(push)
    push.control.close()


def _transfers(*rows: torch.Tensor) -> list[Transfer]:
    return [Transfer(f"t{i}", f"hash{i}", r) for i, r in enumerate(rows)]


def _count(pusher: MooncakePusher, result: str) -> float:
    return pusher._metrics.mooncake_pushes.labels(result)._value.get()


async def _settled(pusher: MooncakePusher) -> None:
    """The cancels a failed push left running in the background, done."""
    await asyncio.gather(*pusher._cleanups)


async def test_every_shard_gets_the_rows_in_the_consumers_dtype(pusher: MooncakePusher, consumer: FakeConsumer) -> None:
    first, second = torch.randn(6, 8), torch.randn(4, 8)
    receipt = await pusher.push(consumer.control, _transfers(first, second), torch.bfloat16)
    for shard in (0, 1):
        assert torch.equal(consumer.rows("t0", shard), first.to(torch.bfloat16))
        assert torch.equal(consumer.rows("t1", shard), second.to(torch.bfloat16))
        assert consumer.states(shard) == {"t0": "READY", "t1": "READY"}
    assert receipt.transfer_ids == ("t0", "t1")
    assert receipt.nbytes == 2 * (6 + 4) * 8 * 2  # both shards' copies
    assert [op for op in consumer.ops() if op != "peers"] == ["reserve_batch"] * 2 + ["complete_batch"] * 2
    reserved = next(payload for _, payload in consumer.calls if payload["op"] == "reserve_batch")
    assert reserved["items"][0] == {
        "transfer_id": "t0",
        "mm_hash": "hash0",
        "nbytes": 6 * 8 * 2,
        "shape": [6, 8],
        "dtype": "bfloat16",
    }
    assert _count(pusher, "ok") == 1


async def test_an_item_the_consumer_holds_is_neither_written_nor_completed_again(
    pusher: MooncakePusher, consumer: FakeConsumer
) -> None:
    rows = torch.randn(3, 8)
    await pusher.push(consumer.control, [Transfer("first", "same", rows)], torch.float32)
    consumer.calls.clear()
    receipt = await pusher.push(consumer.control, [Transfer("again", "same", rows)], torch.float32)
    assert receipt.nbytes == 0
    assert consumer.ops() == ["reserve_batch", "reserve_batch"]  # no write, no completion: it was ready


async def test_the_same_item_twice_is_written_once_and_both_become_ready(
    pusher: MooncakePusher, consumer: FakeConsumer
) -> None:
    rows = torch.randn(3, 8)
    receipt = await pusher.push(
        consumer.control, [Transfer("a", "same", rows), Transfer("b", "same", rows)], torch.float32
    )
    assert receipt.nbytes == 2 * rows.nbytes  # once per shard
    assert consumer.states(0) == {"a": "READY", "b": "READY"}


async def test_a_refusal_on_one_shard_cancels_the_others_reservations(
    pusher: MooncakePusher, consumer: FakeConsumer, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = consumer._reserve

    def second_shard_full(shard: int, item: dict) -> dict:
        if shard == 1:
            raise RuntimeError("EC consumer buffer pool is full")
        return original(shard, item)

    monkeypatch.setattr(consumer, "_reserve", second_shard_full)
    with pytest.raises(EncoderCachePushFailed) as failed:
        await pusher.push(consumer.control, _transfers(torch.randn(2, 8)), torch.float32)
    await _settled(pusher)
    error = failed.value
    assert (error.status, error.code, error.details["stage"]) == (503, "ec_push_failed", "reserve")
    assert "buffer pool is full" in error.message and error.headers["Retry-After"] == "1"
    assert consumer.states(0) == {"t0": "CANCELLED"}
    assert "complete_batch" not in consumer.ops()
    cancels = [payload for _, payload in consumer.calls if payload["op"] == "cancel"]
    assert all(cancel["abandon"] for cancel in cancels) and len(cancels) == 2  # the refused one by its id alone
    assert _count(pusher, "refused") == 1


async def test_a_write_that_fails_midway_cancels_and_never_completes(
    pusher: MooncakePusher, consumer: FakeConsumer, monkeypatch: pytest.MonkeyPatch
) -> None:
    write = pusher.transfer.write

    def wrong_second_address(session: str, sources: Sequence[torch.Tensor], destinations: Sequence[int]) -> None:
        # A real Mooncake failure: the second item's destination lies outside the consumer's registered pool.
        write(session, sources, [destinations[0], 4096, *destinations[2:]])

    monkeypatch.setattr(pusher.transfer, "write", wrong_second_address)
    with pytest.raises(EncoderCachePushFailed) as failed:
        await pusher.push(consumer.control, _transfers(torch.randn(2, 8), torch.randn(3, 8)), torch.float32)
    await _settled(pusher)
    assert failed.value.details["stage"] == "write"
    assert "complete_batch" not in consumer.ops()
    assert set(consumer.states(0).values()) == set(consumer.states(1).values()) == {"CANCELLED"}
    assert _count(pusher, "failed") == 1


async def test_a_reservation_lost_before_completion_fails_the_push(
    pusher: MooncakePusher, consumer: FakeConsumer
) -> None:
    consumer.lose_on_complete = True  # as vLLM answers for an expired, cancelled or restarted reservation
    with pytest.raises(EncoderCachePushFailed) as failed:
        await pusher.push(consumer.control, _transfers(torch.randn(2, 8)), torch.float32)
    await _settled(pusher)
    assert failed.value.details["stage"] == "complete"
    assert "no longer holds" in failed.value.message
    assert consumer.ops().count("cancel") == 2


async def test_a_cancelled_push_cancels_its_reservations_only_after_its_write_ends(
    pusher: MooncakePusher, consumer: FakeConsumer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A destination cancelled while Mooncake writes into it would be freed under the writer."""
    writing, release = threading.Event(), threading.Event()
    write = pusher.transfer.write
    finished: list[float] = []

    def slow(session: str, sources: Sequence[torch.Tensor], destinations: Sequence[int]) -> None:
        writing.set()
        release.wait(5)
        write(session, sources, destinations)
        finished.append(time.monotonic())

    monkeypatch.setattr(pusher.transfer, "write", slow)
    task = asyncio.create_task(pusher.push(consumer.control, _transfers(torch.randn(2, 8)), torch.float32))
    await asyncio.to_thread(writing.wait, 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.2)
    assert "cancel" not in consumer.ops()  # the write still runs
    release.set()
    await _settled(pusher)
    assert consumer.ops().count("cancel") == 2 and finished
    assert set(consumer.states(0).values()) == {"CANCELLED"}
    assert _count(pusher, "cancelled") == 1


async def test_a_consumer_that_does_not_answer_fails_within_the_control_timeout(
    pusher: MooncakePusher, consumer: FakeConsumer
) -> None:
    consumer.silent = True
    started = time.monotonic()
    with pytest.raises(EncoderCachePushFailed) as failed:
        await pusher.push(consumer.control, _transfers(torch.randn(2, 8)), torch.float32)
    assert time.monotonic() - started < 2
    assert "did not answer" in failed.value.message


async def test_no_consumer_at_all_fails_fast(pusher: MooncakePusher) -> None:
    started = time.monotonic()
    with pytest.raises(EncoderCachePushFailed) as failed:
        await pusher.push(f"tcp://127.0.0.1:{free_port()}", _transfers(torch.randn(2, 8)), torch.float32)
    assert failed.value.details["stage"] == "reserve"
    assert time.monotonic() - started < 2


async def test_a_released_push_is_cancelled(pusher: MooncakePusher, consumer: FakeConsumer) -> None:
    receipt = await pusher.push(consumer.control, _transfers(torch.randn(2, 8)), torch.float32)
    pusher.release(receipt)
    await _settled(pusher)
    assert consumer.states(0) == consumer.states(1) == {"t0": "CANCELLED"}


def test_without_mooncake_the_error_names_the_extra_and_the_libraries(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "mooncake.engine", None)  # what an absent package or library gives
    with pytest.raises(MooncakeUnavailable) as missing:
        require_mooncake()
    assert "mmencode[mooncake]" in str(missing.value)
    assert "libibverbs1 libnl-3-200 libnl-route-3-200" in str(missing.value)
