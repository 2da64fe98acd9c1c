"""The shipped HAProxy policy in front of three replica processes on one Redis, all real, on loopback."""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers import RedisServer, Replica, data_uri, free_port, haproxy_serving, noise_image, require_binary

ROOT = Path(__file__).resolve().parents[2]
POLICY = ROOT / "deploy" / "haproxy" / "haproxy.cfg"


@contextlib.contextmanager
def haproxy(replicas: list[Replica], tmp_path: Path) -> Iterator[str]:
    """HAProxy with the shipped policy file unchanged; only the server list is this test's."""
    servers = tmp_path / "replicas.cfg"
    lines = ["backend mmencode"] + [f"    server r{i} 127.0.0.1:{r.port}" for i, r in enumerate(replicas)]
    servers.write_text("\n".join(lines) + "\n")
    port = free_port()
    env = {"MMENCODE_LB_BIND": f"127.0.0.1:{port}", "MMENCODE_LB_STATS_BIND": f"127.0.0.1:{free_port()}"}
    with haproxy_serving([POLICY, servers], env=env, port=port) as url:
        yield url


@pytest.fixture(scope="module")
def cluster(
    checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, list[Replica]]]:
    """Three replicas and the balancer, shared by this module's tests; the test that kills one runs last."""
    tmp_path = tmp_path_factory.mktemp("cluster")
    with RedisServer(require_binary("redis-server", "redis-server")).running() as redis_server:
        replicas = [
            Replica(
                ["--model", str(checkpoints["qwen2_vl"]), "--shared-cache", redis_server.url],
                env={"MMENCODE_CACHE_DIR": str(tmp_path / f"cache{i}"), "OMP_NUM_THREADS": "1"},
            )
            for i in range(3)
        ]
        try:
            for replica in replicas:
                replica.start()
            for replica in replicas:
                replica.wait_ready()
            with haproxy(replicas, tmp_path) as url:
                _wait_all_up(url, len(replicas))
                yield url, replicas
        finally:
            for replica in replicas:
                replica.kill()


def _wait_all_up(url: str, count: int, timeout: float = 20) -> None:
    """Until the balancer has sent work to every replica (its health checks passed for all)."""
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=url, timeout=30) as client:
        while len(seen) < count:
            assert time.monotonic() < deadline, f"only {seen} answered through the balancer"
            seen.add(client.get("/v1/models").headers.get("x-mmencode-replica", ""))


def _item(seed: int) -> dict[str, str]:
    return {"image": data_uri(noise_image(64, 48, seed=seed))}


def test_hash_only_items_work_whichever_replica_answers(cluster: tuple[str, list[Replica]]) -> None:
    url, _ = cluster
    with httpx.Client(base_url=url, timeout=60) as client:
        first = client.post("/v1/encode", json={"items": [_item(1000), _item(1001)]})
        assert first.status_code == 200, first.text
        hashes = [item["hash"] for item in first.json()["items"]]
        encoded_on = first.headers["x-mmencode-replica"]
        time.sleep(0.5)  # the shared-tier write happens after the response
        answered_by = set()
        for _ in range(9):
            response = client.post("/v1/encode", json={"items": [{"hash": h} for h in hashes]})
            assert response.status_code == 200, response.text
            assert [item["source"] for item in response.json()["items"]] == ["cache", "cache"]
            answered_by.add(response.headers["x-mmencode-replica"])
    assert answered_by - {encoded_on}, "every hash request went back to the replica that encoded it"


def test_requests_spread_and_a_killed_replica_loses_none(cluster: tuple[str, list[Replica]]) -> None:
    url, replicas = cluster
    served_by: collections.Counter[str] = collections.Counter()
    failures: list[str] = []
    lock = threading.Lock()
    killed = threading.Event()

    cut: list[int] = []

    def send(seed: int) -> None:
        with httpx.Client(base_url=url, timeout=60) as client:
            try:
                response = client.post("/v1/encode", json={"items": [_item(seed)]})
            except httpx.RemoteProtocolError:
                # The SIGKILL landed while r0 was writing this answer, past its headers: no proxy can
                # retry an answer it has begun to pass on. Encoding is idempotent, so the client retries.
                with lock:
                    cut.append(seed)
                response = client.post("/v1/encode", json={"items": [_item(seed)]})
        with lock:
            served_by[response.headers.get("x-mmencode-replica", "?")] += 1
            if response.status_code != 200:
                failures.append(f"{response.status_code} {response.text[:200]}")

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        futures = []
        for seed in range(90):
            futures.append(pool.submit(send, seed))
            if seed == 30:
                # Mid-run, with requests in flight everywhere: SIGKILL, no drain.
                replicas[0].kill()
                killed.set()
            time.sleep(0.01)
        for future in futures:
            future.result()

    assert killed.is_set()
    assert failures == [], failures
    assert len(cut) <= 6, cut  # at most the requests in flight at the kill; every other retried by HAProxy
    assert set(served_by) == {"r0", "r1", "r2"}, served_by
    assert served_by["r1"] > served_by["r0"] and served_by["r2"] > served_by["r0"]
