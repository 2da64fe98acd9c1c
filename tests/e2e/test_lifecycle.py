"""Deadlines, admission under overload, readiness while draining, and graceful shutdown."""

from __future__ import annotations

import concurrent.futures
import socket
import threading
import time
from pathlib import Path

import httpx
import torch

from tests.helpers import assert_error, data_uri, live_server, noise_image, precomputed

BIG = [{"image": data_uri(noise_image(640, 480, seed=s))} for s in range(12)]


def test_past_the_deadline_is_504_and_the_service_stays_up(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    server_options = {"model": checkpoints["qwen2_vl"], "cache_dir": tmp_path, "request_timeout": 0.05}
    with live_server(**server_options) as server, server.client() as client:
        slow = client.post("/v1/encode", json={"items": BIG})
        error = assert_error(slow, 504, "timeout")
        assert error["details"] == {"timeout_s": 0.05}
        assert client.get("/ready").status_code == 200
        grid = {"image_grid_thw": [1, 4, 4]}
        item = {"precomputed_embedding": precomputed(torch.zeros(4, 64)), "metadata": grid}
        assert client.post("/v1/encode", json={"items": [item]}).status_code == 200


def test_overload_answers_503_with_retry_after_and_loses_nothing(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    with live_server(model=checkpoints["qwen2_vl"], cache_dir=tmp_path, max_queue=1, max_batch_items=4) as server:

        def send(seed: int) -> httpx.Response:
            items = [{"image": data_uri(noise_image(320, 240, seed=1000 + seed * 4 + k))} for k in range(4)]
            with server.client() as client:
                return client.post("/v1/encode", json={"items": items})

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            responses = list(pool.map(send, range(32)))
    statuses = sorted({r.status_code for r in responses})
    assert set(statuses) <= {200, 503}, statuses
    overloaded = [r for r in responses if r.status_code == 503]
    assert overloaded, "a queue of one under 16 concurrent clients must refuse some"
    for response in overloaded:
        assert_error(response, 503, "overloaded")
        assert response.headers["retry-after"] == "1"
    assert all(len(r.json()["items"]) == 4 for r in responses if r.status_code == 200)


def test_draining_turns_readiness_off_and_finishes_in_flight_work(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    with live_server(model=checkpoints["qwen2_vl"], cache_dir=tmp_path) as server:
        started = threading.Event()

        def slow_request() -> httpx.Response:
            with server.client() as client:
                started.set()
                return client.post("/v1/encode", json={"items": BIG})

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            in_flight = pool.submit(slow_request)
            started.wait()
            engine = server.server.config.app.state.engine  # type: ignore[union-attr]
            deadline = time.monotonic() + 30
            while engine.worker.pending == 0 and time.monotonic() < deadline:
                time.sleep(0.005)  # until the slow request has been accepted by the worker
            assert engine.worker.pending == 1
            with server.client() as client:
                engine.begin_drain()
                ready = client.get("/ready")
                refused = client.post("/v1/encode", json={"items": BIG[:1]})
            server.server.should_exit = True  # uvicorn stops accepting and waits for in-flight requests
            finished = in_flight.result(timeout=60)
    error = assert_error(ready, 503, "not_ready")
    assert error["details"] == {"phase": "draining"}
    assert_error(refused, 503, "not_ready")
    assert finished.status_code == 200, finished.text
    assert len(finished.json()["items"]) == len(BIG)


def test_a_client_that_leaves_mid_body_is_not_an_internal_error(qwen_server) -> None:  # type: ignore[no-untyped-def]
    host, port = qwen_server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /v1/encode HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100000\r\n\r\n{"items": [{"image": "'
        )
    deadline = time.monotonic() + 10
    with qwen_server.client() as client:
        while time.monotonic() < deadline:
            metrics = client.get("/metrics").text
            if 'route="/v1/encode",status="499"' in metrics:
                break
            time.sleep(0.05)
    assert 'mmencode_requests_total{method="POST",route="/v1/encode",status="499"}' in metrics
    assert 'mmencode_errors_total{code="internal_error"}' not in metrics
