"""Image URLs through the live service: the real app under uvicorn fetches from a loopback image server.

The image server listens on 127.0.0.1 only, which the service may reach through the test-only
allowlist ``allowed_url_hosts=["127.0.0.1"]``; every other destination here must be refused before a
connection is attempted (the refusals are timed to show it).
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
from tests.test_fetch import HUGE, PNG, ImageServer, image_server

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


def test_redirect_chain_within_the_limit(service: LiveServer, images: ImageServer) -> None:
    response, _ = encode(service, f"{images.url}/chain/3")
    assert response.status_code == 200, response.text


def test_redirect_loop(service: LiveServer, images: ImageServer) -> None:
    error, elapsed = fetch_error(service, f"{images.url}/loop", 400, "image_fetch_failed")
    assert "redirect" in error["message"]
    assert error["details"]["max_redirects"] == 3
    assert elapsed < FETCH_TIMEOUT


def test_redirect_over_the_limit(service: LiveServer, images: ImageServer) -> None:
    error, _ = fetch_error(service, f"{images.url}/chain/4", 400, "image_fetch_failed")
    assert "redirect" in error["message"]


def test_slow_server_times_out_in_about_the_timeout(service: LiveServer, images: ImageServer) -> None:
    error, elapsed = fetch_error(service, f"{images.url}/slow", 400, "image_fetch_failed")
    assert "time" in error["message"].lower()
    assert FETCH_TIMEOUT * 0.9 <= elapsed < FETCH_TIMEOUT + 2.0


def test_http_error_status(service: LiveServer, images: ImageServer) -> None:
    error, _ = fetch_error(service, f"{images.url}/missing", 400, "image_fetch_failed")
    assert "404" in error["message"]
    assert error["details"]["status"] == 404


def test_html_is_not_an_image(service: LiveServer, images: ImageServer) -> None:
    error, _ = fetch_error(service, f"{images.url}/html", 400, "image_fetch_failed")
    assert "text/html" in error["message"]


@pytest.mark.parametrize("route", ["/big-length", "/big-stream"])
def test_oversized_body_is_refused_without_reading_it(service: LiveServer, route: str) -> None:
    with image_server() as own:  # its own server: the streams are counted per route
        error, elapsed = fetch_error(service, f"{own.url}{route}", 413, "payload_too_large")
        assert error["details"]["max_bytes"] == MAX_IMAGE_BYTES
        assert elapsed < FETCH_TIMEOUT
        served = own.served(route)
        assert served.done.wait(5), "the server kept sending after the service gave up"
        assert not served.completed
        assert served.sent < HUGE // 8, served.sent


@pytest.mark.parametrize(
    "target",
    [
        "http://localhost:{port}/echo?n=localhost",  # a name that is not on the allowlist, resolving to loopback
        "http://[::1]:{port}/echo?n=v6",
        "http://[::ffff:127.0.0.1]:{port}/echo?n=mapped",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/",
        "http://0.0.0.0:{port}/echo?n=zero",
    ],
)
def test_redirect_to_a_forbidden_address_is_refused_before_connecting(
    service: LiveServer, images: ImageServer, target: str
) -> None:
    location = target.format(port=images.port)
    error, elapsed = fetch_error(service, f"{images.url}/redirect?to={location}", 400, "url_not_allowed")
    assert elapsed < FETCH_TIMEOUT * 0.9  # refused, not tried until a connect timeout
    assert "non-public" in error["message"]
    assert not any(path.startswith("/echo?n=") for path in images.paths())


@pytest.mark.parametrize(
    "url",
    [
        "http://localhost:{port}/good.png",
        "http://[::1]:{port}/good.png",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/image.png",
    ],
)
def test_forbidden_address_is_refused_before_connecting(service: LiveServer, images: ImageServer, url: str) -> None:
    _, elapsed = fetch_error(service, url.format(port=images.port), 400, "url_not_allowed")
    assert elapsed < FETCH_TIMEOUT * 0.9


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://127.0.0.1/image.png", "gopher://127.0.0.1:70/_GET"])
def test_only_http_and_https(service: LiveServer, url: str) -> None:
    error, _ = fetch_error(service, url, 400, "url_not_allowed")
    assert "scheme" in error["message"]


def test_url_in_a_batch_fails_the_whole_request(service: LiveServer, images: ImageServer) -> None:
    with service.client() as client:
        response = client.post("/v1/encode", json={"items": [{"image": PNG_URI}, {"image": f"{images.url}/missing"}]})
    error = assert_error(response, 400, "image_fetch_failed")
    assert "404" in error["message"]


def test_service_still_serves_after_fetch_failures(service: LiveServer, images: ImageServer) -> None:
    response, _ = encode(service, data_uri(noise_image(32, 32, seed=5)))
    assert response.status_code == 200, response.text
