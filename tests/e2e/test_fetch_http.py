"""Image URLs through the live service: the real app under uvicorn fetches from a loopback image server.

What a URL gives (the same rows as the bytes inline), and each fetch error's HTTP shape once, with the
service's own limits (redirects, bytes, timeout, allowlist) in its details. The fetcher's rules case by
case (schemes, private addresses, every redirect hop, bodies cut without being read, content types)
are tested on the fetcher itself, in tests/unit/media/test_fetch.py. The image server listens on 127.0.0.1 only,
which the service may reach through the test-only allowlist ``allowed_url_hosts=["127.0.0.1"]``.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from tests.helpers import LiveServer, assert_error, data_uri, live_server, noise_image, rows_of
from tests.unit.media.test_fetch import PNG, ImageServer, image_server

FETCH_TIMEOUT = 1.0
MAX_IMAGE_BYTES = 256 * 1024
PNG_URI = "data:image/png;base64," + base64.b64encode(PNG).decode()


@pytest.fixture(scope="module")
def images() -> Iterator[ImageServer]:
    with image_server() as server:
        yield server


@pytest.fixture(scope="module")
def service(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(
        model=checkpoints["qwen2_vl"],
        served_model_name="tiny-qwen2-vl",
        cache_dir=tmp_path_factory.mktemp("cache"),
        cache_bytes=0,  # every image goes through the encoder: URL and data URI are compared, not cached
        allowed_url_hosts=["127.0.0.1"],
        url_fetch_timeout=FETCH_TIMEOUT,
        url_max_redirects=3,
        max_image_bytes=MAX_IMAGE_BYTES,
    ) as server:
        yield server


def encode(service: LiveServer, image: str) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    with service.client() as client:
        response = client.post("/v1/encode", json={"items": [{"image": image}]})
    return response, time.monotonic() - started


def fetch_error(service: LiveServer, url: str, status: int, code: str) -> tuple[dict[str, Any], float]:
    response, elapsed = encode(service, url)
    return assert_error(response, status, code), elapsed


def test_url_gives_the_same_rows_as_the_same_bytes_inline(service: LiveServer, images: ImageServer) -> None:
    by_url, _ = encode(service, f"{images.url}/good.png")
    inline, _ = encode(service, PNG_URI)
    assert by_url.status_code == 200, by_url.text
    assert inline.status_code == 200, inline.text
    url_item, inline_item = by_url.json()["items"][0], inline.json()["items"][0]
    assert url_item["source"] == inline_item["source"] == "encoder"
    assert url_item["hash"] == inline_item["hash"]
    assert url_item["metadata"] == inline_item["metadata"]
    torch.testing.assert_close(rows_of(url_item), rows_of(inline_item), atol=1e-6, rtol=0)
    assert images.headers_of("/good.png")["host"] == f"127.0.0.1:{images.port}"


def test_openai_embeddings_accept_a_url(service: LiveServer, images: ImageServer) -> None:
    with service.client() as client:
        by_url = client.post("/v1/embeddings", json={"model": "tiny-qwen2-vl", "input": f"{images.url}/good.png"})
        inline = client.post("/v1/embeddings", json={"model": "tiny-qwen2-vl", "input": PNG_URI})
    assert by_url.status_code == 200, by_url.text
    torch.testing.assert_close(
        torch.tensor(by_url.json()["data"][0]["embedding"]),
        torch.tensor(inline.json()["data"][0]["embedding"]),
        atol=1e-6,
        rtol=0,
    )


@pytest.mark.parametrize(
    ("path", "status", "code", "details"),
    [
        ("/chain/4", 400, "image_fetch_failed", {"max_redirects": 3}),  # one more redirect than allowed
        ("/big-stream", 413, "payload_too_large", {"max_bytes": MAX_IMAGE_BYTES}),
        ("http://localhost:{port}/good.png", 400, "url_not_allowed", {"host": "localhost"}),  # not on the list
    ],
    ids=["fetch-failed", "too-large", "not-allowed"],
)
def test_each_fetch_error_has_its_shape_and_the_services_limits(
    service: LiveServer, images: ImageServer, path: str, status: int, code: str, details: dict[str, Any]
) -> None:
    url = path.format(port=images.port) if path.startswith("http") else f"{images.url}{path}"
    error, elapsed = fetch_error(service, url, status, code)
    assert details.items() <= error["details"].items(), error
    assert elapsed < FETCH_TIMEOUT  # refused or cut, never waited out


def test_slow_server_times_out_in_about_the_services_timeout(service: LiveServer, images: ImageServer) -> None:
    error, elapsed = fetch_error(service, f"{images.url}/slow", 400, "image_fetch_failed")
    assert "time" in error["message"].lower()
    assert FETCH_TIMEOUT * 0.9 <= elapsed < FETCH_TIMEOUT + 2.0


def test_url_in_a_batch_fails_the_whole_request(service: LiveServer, images: ImageServer) -> None:
    with service.client() as client:
        response = client.post("/v1/encode", json={"items": [{"image": PNG_URI}, {"image": f"{images.url}/missing"}]})
    error = assert_error(response, 400, "image_fetch_failed")
    assert "404" in error["message"]


def test_service_still_serves_after_fetch_failures(service: LiveServer, images: ImageServer) -> None:
    response, _ = encode(service, data_uri(noise_image(32, 32, seed=5)))
    assert response.status_code == 200, response.text
