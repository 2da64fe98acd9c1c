"""One encode per item across replicas: two replicas on one real redis-server take leases on what they
encode, wait for each other's values, take over from a holder that died, and serve alone when Redis is gone.

The module's two replicas and Redis are shared by its tests (short leases: 2 s); the test that stops Redis
runs last.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from mmencode.app.engine.cache import content_hash
from tests.helpers import (
    LiveServer,
    RedisServer,
    Replica,
    data_uri,
    image_bytes,
    live_server,
    noise_image,
    require_binary,
)

LEASE = {"shared_cache_lease_ttl": 2.0, "shared_cache_lease_wait": 10.0}


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer(require_binary("redis-server", "redis-server")).running() as server:
        yield server


@pytest.fixture(scope="module")
def replicas(
    checkpoints: dict[str, Path], redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LiveServer, LiveServer]]:
    root = tmp_path_factory.mktemp("scale-out")
    # Cache off: every request that is not answered by another's encode must encode (what is counted).
    common = {"model": checkpoints["qwen2_vl"], "shared_cache": redis_server.url, "cache_bytes": 0, **LEASE}
    with (
        live_server(cache_dir=root / "a", **common) as a,
        live_server(cache_dir=root / "b", **common) as b,
    ):
        yield a, b


def _encodes(*servers: LiveServer) -> float:
    return sum(_metric(server, 'mmencode_items_total{source="encoder"}') for server in servers)


def _metric(server: LiveServer, sample: str) -> float:
    for line in httpx.get(server.url + "/metrics").text.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _post(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + "/v1/encode", json=body, timeout=60)


def _concurrently(urls: list[str], body: dict[str, Any]) -> list[httpx.Response]:
    with concurrent.futures.ThreadPoolExecutor(len(urls)) as pool:
        return list(pool.map(lambda url: _post(url, body), urls))


def test_32_identical_requests_split_between_two_replicas_encode_once(
    replicas: tuple[LiveServer, LiveServer],
) -> None:
    a, b = replicas
    before = _encodes(a, b)
    body = {"items": [{"image": data_uri(noise_image(180, 120, seed=9001))}], "encoding_format": "float"}
    answers = _concurrently([a.url, b.url] * 16, body)
    assert all(answer.status_code == 200 for answer in answers), [a.text for a in answers if a.status_code != 200]
    items = [answer.json()["items"][0] for answer in answers]
    assert len({item["hash"] for item in items}) == 1
    assert all(item["embedding"]["data"] == items[0]["embedding"]["data"] for item in items)
    assert _encodes(a, b) - before == 1
    assert [item["source"] for item in items].count("encoder") == 1
    waited = sum(_metric(s, 'mmencode_shared_lease_total{result="waited"}') for s in (a, b))
    assert waited >= 1  # the replica that did not encode read the other's value


def test_a_lease_whose_holder_vanished_is_taken_over_after_it_expires(
    replicas: tuple[LiveServer, LiveServer], redis_server: RedisServer
) -> None:
    """A holder that never publishes (this test, holding the lease as a replica that died would): the
    replicas wait until the lease expires, then one of them encodes, once, and every request is answered."""
    a, b = replicas
    image = noise_image(140, 100, seed=9002)
    engine = a.server.config.app.state.engine  # type: ignore[attr-defined]
    target = content_hash(engine.adapter.fingerprint, image_bytes(image))
    before = _encodes(a, b)
    store = redis.Redis.from_url(redis_server.url)
    assert store.set(engine.cache.leases.lease_key(target), b"a-dead-replica", nx=True, px=1500)
    started = time.monotonic()
    answers = _concurrently([a.url, b.url] * 4, {"items": [{"image": data_uri(image)}]})
    took = time.monotonic() - started
    assert all(answer.status_code == 200 for answer in answers)
    assert {answer.json()["items"][0]["hash"] for answer in answers} == {target}
    assert took >= 1.2, f"answered in {took:.2f}s, before the lease expired"
    assert _encodes(a, b) - before == 1
    took_over = sum(_metric(s, 'mmencode_shared_lease_total{result="took_over"}') for s in (a, b))
    assert took_over == 1


def test_killing_the_lease_holder_mid_encode_lets_the_other_replica_encode(
    checkpoints: dict[str, Path], redis_server: RedisServer, replicas: tuple[LiveServer, LiveServer], tmp_path: Path
) -> None:
    """A replica process takes the lease and is stopped dead in its encode (SIGSTOP, then SIGKILL): its
    lease expires, B takes it over and encodes, and every request is answered (the killed replica's own
    client retries on B, as a balancer would)."""
    _, b = replicas
    store = redis.Redis.from_url(redis_server.url)
    holder = Replica(
        ["--model", str(checkpoints["qwen2_vl"]), "--shared-cache", redis_server.url, "--cache-bytes", "0",
         "--shared-cache-lease-ttl", "2", "--log-level", "warning"],
        env={"MMENCODE_CACHE_DIR": str(tmp_path / "holder"), "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    holder.start()
    try:
        holder.wait_ready()
        for attempt in range(3):
            # A large PNG: decoding it keeps the lease held for a while before the value can exist.
            image = data_uri(noise_image(1400, 1400, seed=9100 + attempt))
            body = {"items": [{"image": image}]}
            before = _encodes(b)
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                on_holder = pool.submit(_post_or_none, holder.url, body)
                lease = _wait_for_lease(store)
                assert holder.process is not None
                os.kill(holder.process.pid, signal.SIGSTOP)
                published = store.exists(lease.removesuffix(":lease"))
                if published:  # too late: the holder had already written the value; try a fresh image
                    os.kill(holder.process.pid, signal.SIGCONT)
                    on_holder.result()
                    continue
                started = time.monotonic()
                on_b = [pool.submit(_post, b.url, body) for _ in range(2)]
                answers = [future.result() for future in on_b]
                waited = time.monotonic() - started
                holder.kill()
                lost = on_holder.result()
            assert lost is None  # the holder died before answering
            retried = _post(b.url, body)  # what the holder's client does next
            assert all(answer.status_code == 200 for answer in [*answers, retried])
            assert _encodes(b) - before == 1, "B encoded the item once, after the lease expired"
            assert waited > 0.5, f"B answered in {waited:.2f}s: it did not wait for the lease"
            return
        pytest.fail("the holder published every image before it could be stopped")
    finally:
        if holder.process is not None and holder.process.poll() is None:
            os.kill(holder.process.pid, signal.SIGCONT)
        holder.kill()


def _wait_for_lease(store: redis.Redis, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        keys = store.keys("mmencode:*:lease")
        if keys:
            return str(keys[0].decode())
        time.sleep(0.001)
    raise AssertionError("no lease was taken")


def _post_or_none(url: str, body: dict[str, Any]) -> httpx.Response | None:
    try:
        return _post(url, body)
    except httpx.TransportError:
        return None


def test_with_redis_stopped_every_request_is_still_answered(
    replicas: tuple[LiveServer, LiveServer], redis_server: RedisServer
) -> None:
    a, b = replicas
    redis_server.kill()
    try:
        body = {"items": [{"image": data_uri(noise_image(100, 80, seed=9003))}]}
        answers = _concurrently([a.url, b.url] * 8, body)
        assert all(answer.status_code == 200 for answer in answers), answers[0].text
        assert len({answer.json()["items"][0]["hash"] for answer in answers}) == 1
        unavailable = sum(_metric(s, 'mmencode_shared_lease_total{result="unavailable"}') for s in (a, b))
        assert unavailable >= 1
    finally:
        redis_server.start()
