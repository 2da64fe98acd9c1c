"""Two replicas on one real redis-server: hashes travel between them, and Redis failing never fails a request."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import torch

from mmencode.app.engine.cache import CachedEmbedding, SharedCache
from mmencode.app.engine.cache.shared import decode_value
from mmencode.app.metrics import Metrics
from tests.helpers import (
    LiveServer,
    RedisServer,
    assert_error,
    data_uri,
    live_server,
    noise_image,
    require_binary,
    rows_of,
)


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    with RedisServer(require_binary("redis-server", "redis-server")).running() as server:
        yield server


@contextlib.contextmanager
def two_replicas(checkpoint: Path, redis_url: str, tmp_path: Path, **settings: Any) -> Iterator[list[LiveServer]]:
    with (
        live_server(model=checkpoint, cache_dir=tmp_path / "a", shared_cache=redis_url, **settings) as a,
        live_server(model=checkpoint, cache_dir=tmp_path / "b", shared_cache=redis_url, **settings) as b,
    ):
        yield [a, b]


def _encode(client: httpx.Client, item: dict[str, Any]) -> httpx.Response:
    return client.post("/v1/encode", json={"items": [item]})


def _wait_for_key(server: RedisServer, content_hash: str, timeout: float = 10) -> str:
    """Writes are in the background: wait until the item's key is in Redis; returns the key."""
    client = redis.Redis.from_url(server.url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        keys = client.keys(f"mmencode:*:{content_hash}")
        if keys:
            return str(keys[0].decode())
        time.sleep(0.02)
    raise AssertionError(f"{content_hash} never reached the shared cache")


def _image(seed: int) -> dict[str, str]:
    return {"image": data_uri(noise_image(120, 90, seed=seed))}


def test_a_hash_encoded_on_one_replica_is_served_by_the_other(
    checkpoints: dict[str, Path], redis_server: RedisServer, tmp_path: Path
) -> None:
    with (
        two_replicas(checkpoints["qwen2_vl"], redis_server.url, tmp_path) as (a, b),
        a.client() as client_a,
        b.client() as client_b,
    ):
        first = _encode(client_a, _image(1))
        assert first.status_code == 200, first.text
        item_a = first.json()["items"][0]
        assert item_a["source"] == "encoder"
        key = _wait_for_key(redis_server, item_a["hash"])
        ttl = redis.Redis.from_url(redis_server.url).ttl(key)
        assert a.settings.shared_cache_ttl - 60 < ttl <= a.settings.shared_cache_ttl

        by_hash = _encode(client_b, {"hash": item_a["hash"]})
        assert by_hash.status_code == 200, by_hash.text
        item_b = by_hash.json()["items"][0]
        assert item_b["source"] == "cache"
        assert item_b["metadata"] == item_a["metadata"] and item_b["num_tokens"] == item_a["num_tokens"]
        # The model computes in float32 on CPU, so the default storage dtype keeps every bit.
        assert torch.equal(rows_of(item_b), rows_of(item_a))

        # The same image sent to B is a hit too, under the same hash. A second image, encoded on B
        # this time, reaches A through the shared tier.
        again = _encode(client_b, _image(1)).json()["items"][0]
        assert (again["source"], again["hash"]) == ("cache", item_a["hash"])
        fresh = _encode(client_b, _image(2)).json()["items"][0]
        assert fresh["source"] == "encoder"
        _wait_for_key(redis_server, fresh["hash"])
        assert _encode(client_a, {"hash": fresh["hash"]}).json()["items"][0]["source"] == "cache"

        shared_hits = 'mmencode_cache_lookups_total{result="hit",tier="shared"}'
        assert _metric(client_b, shared_hits) >= 1 and _metric(client_a, shared_hits) >= 1
        assert _metric(client_a, "mmencode_shared_cache_written_bytes_total") > 0


def test_redis_killed_paused_and_restarted(
    checkpoints: dict[str, Path], redis_server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mmencode.cache")
    with (
        two_replicas(checkpoints["qwen2_vl"], redis_server.url, tmp_path, shared_cache_timeout=0.2) as (a, b),
        a.client() as client_a,
        b.client() as client_b,
    ):
        clients = [client_a, client_b]
        seed = iter(range(100, 10_000))
        normal = max(_timed(c, _image(next(seed)))[1] for c in clients for _ in range(3))
        # The replicas must not wait on a dead store for longer than one short timeout.
        allowed = normal + 0.2 + 1.0

        redis_server.kill()
        for _ in range(4):
            for client in clients:
                response, took = _timed(client, _image(next(seed)))
                assert response.status_code == 200, response.text
                assert took < allowed, f"{took:.2f}s with Redis down, {normal:.2f}s before"
        assert_error(_encode(client_b, {"hash": "0" * 32}), 400, "unknown_hash")
        assert client_a.get("/ready").status_code == 200 and client_b.get("/ready").status_code == 200
        assert _metric(client_a, 'mmencode_shared_cache_errors_total{op="get"}') >= 1
        failures = [r for r in caplog.records if "shared cache" in r.getMessage() and r.levelno == logging.WARNING]
        assert len(failures) == 2, [r.getMessage() for r in failures]  # once per replica, not once per request

        # Back on the same port: sharing resumes without touching the replicas.
        redis_server.start()
        deadline = time.monotonic() + 15
        while True:
            item = _encode(client_a, _image(next(seed))).json()["items"][0]
            with contextlib.suppress(AssertionError):
                _wait_for_key(redis_server, item["hash"], timeout=0.5)
                break
            assert time.monotonic() < deadline, "the replicas never used the restarted Redis"
            time.sleep(0.3)
        # B may still be resting (a second after its last failure) before it asks the store again.
        deadline = time.monotonic() + 5
        while (served := _encode(client_b, {"hash": item["hash"]})).status_code != 200:
            assert_error(served, 400, "unknown_hash")
            assert time.monotonic() < deadline, "B never read the restarted Redis"
            time.sleep(0.2)
        assert served.json()["items"][0]["source"] == "cache"
        assert any("answering again" in r.getMessage() for r in caplog.records)

        # A store that accepts connections but never answers (SIGSTOP): one timeout, then a miss.
        redis_server.pause()
        for client in clients:
            response, took = _timed(client, _image(next(seed)))
            assert response.status_code == 200 and took < allowed, f"{took:.2f}s with Redis hung"
        redis_server.resume()


def test_a_corrupt_or_foreign_value_is_a_miss_not_an_error(
    checkpoints: dict[str, Path], redis_server: RedisServer, tmp_path: Path
) -> None:
    store = redis.Redis.from_url(redis_server.url)
    with two_replicas(checkpoints["qwen2_vl"], redis_server.url, tmp_path) as (a, b):
        with a.client() as client_a:
            hashes = [_encode(client_a, _image(seed)).json()["items"][0]["hash"] for seed in (7, 8)]
        keys = [_wait_for_key(redis_server, h) for h in hashes]
        store.set(keys[0], b"\x00\x01 not an embedding")
        foreign = bytearray(store.get(keys[1]) or b"")
        foreign[foreign.index(b'"version":"1"') + 11] = ord("9")  # a future format version
        store.set(keys[1], bytes(foreign))
        with b.client() as client_b:
            for content_hash, seed in zip(hashes, (7, 8), strict=True):
                assert_error(_encode(client_b, {"hash": content_hash}), 400, "unknown_hash")
                response = _encode(client_b, _image(seed))
                assert response.status_code == 200 and response.json()["items"][0]["source"] == "encoder"
            # Read twice each (by hash, then with the image), refused both times.
            assert _metric(client_b, 'mmencode_shared_cache_errors_total{op="decode"}') == 4
        # The encode that followed rewrote each key with a value this version reads.
        for key in keys:
            deadline = time.monotonic() + 10
            while True:
                with contextlib.suppress(ValueError):
                    assert decode_value(store.get(key) or b"").rows.shape[0] > 0
                    break
                assert time.monotonic() < deadline, "the bad value was never replaced"
                time.sleep(0.05)


def _timed(client: httpx.Client, item: dict[str, Any]) -> tuple[httpx.Response, float]:
    started = time.perf_counter()
    response = _encode(client, item)
    return response, time.perf_counter() - started


def _metric(client: httpx.Client, sample: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_items_over_the_value_cap_stay_local(
    checkpoints: dict[str, Path], redis_server: RedisServer, tmp_path: Path
) -> None:
    with (
        two_replicas(checkpoints["qwen2_vl"], redis_server.url, tmp_path, shared_cache_max_value_bytes=1024) as (a, b),
        a.client() as client_a,
        b.client() as client_b,
    ):
        item = _encode(client_a, _image(20)).json()["items"][0]
        assert item["num_tokens"] * 64 * 4 > 1024
        assert _encode(client_a, {"hash": item["hash"]}).json()["items"][0]["source"] == "cache"
        deadline = time.monotonic() + 5
        while _metric(client_a, 'mmencode_shared_cache_errors_total{op="too_large"}') < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert redis.Redis.from_url(redis_server.url).keys("mmencode:*") == []
        assert_error(_encode(client_b, {"hash": item["hash"]}), 400, "unknown_hash")


async def test_writes_to_a_stalled_store_hold_at_most_their_byte_budget(redis_server: RedisServer) -> None:
    """A store that stops answering (paused) must not pile rows up in the process: background writes hold at
    most ``max_pending_bytes``, the rest are skipped and counted as backlog, and the gauge says what is held."""
    metrics = Metrics()
    value_bytes = 64 * 128 * 4
    shared = SharedCache(
        redis_server.url,
        fingerprint="stall-test",
        store_dtype=torch.float32,
        ttl_s=60,
        max_value_bytes=1 << 20,
        timeout_s=20,
        metrics=metrics,
        max_pending_bytes=3 * value_bytes,
    )
    try:
        assert await shared.get_many(["warm"]) == [None]  # connected before the pause
        redis_server.pause()
        for i in range(10):
            shared.put(f"{i:032x}", CachedEmbedding(torch.randn(64, 128), {}))
        await asyncio.sleep(0.2)
        assert shared.pending_bytes == 3 * value_bytes
        text = metrics.render().decode()
        assert f"mmencode_shared_cache_pending_bytes {float(3 * value_bytes)}" in text
        assert 'mmencode_shared_cache_errors_total{op="backlog"} 7.0' in text
        redis_server.resume()
        await shared.flush()
        assert shared.pending_bytes == 0
        assert redis.Redis.from_url(redis_server.url).exists(shared.key(f"{0:032x}"))
    finally:
        redis_server.resume()
        await shared.aclose()
