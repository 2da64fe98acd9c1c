"""Test helpers: images, data URIs, a real uvicorn server on a loopback port, wire decoding (the parts the
bench shares are in tests/support.py)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import io
import re
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch
import uvicorn
from PIL import Image

from mmencode.app.config import Settings
from mmencode.app.media.image import decode_image
from mmencode.app.server import create_app
from tests import support
from tests.support import free_port as free_port  # re-exported: the tests import it from here
from tests.support import wait_ready as wait_ready


def noise_image(width: int, height: int, seed: int = 0, mode: str = "RGB") -> Image.Image:
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    array = np.random.default_rng(seed).integers(0, 256, (height, width, channels), dtype=np.uint8)
    return Image.fromarray(array.squeeze(-1) if channels == 1 else array, mode=mode)


def preprocessing_images(seed: int = 3) -> list[Image.Image]:
    """Images a preprocessing path must get right: random sizes and aspects, tiny ones, greyscale made
    RGB, and JPEG and PNG files as the service sees them, through its own decoder."""
    rng = np.random.default_rng(seed)
    images = [noise_image(int(w), int(h), seed=i) for i, (w, h) in enumerate(rng.integers(1, 700, (24, 2)))]
    images += [noise_image(320, 240, seed=50), noise_image(64, 64, seed=51), noise_image(2, 1, seed=52)]
    images.append(noise_image(90, 70, seed=53, mode="L").convert("RGB"))
    for fmt in ("JPEG", "PNG"):
        images.append(decode_image(image_bytes(noise_image(333, 251, seed=54), fmt), max_pixels=10**8))
    return images


def transparent_rgb_image() -> Image.Image:
    """An RGB PNG that names a transparent colour, decoded by the service: transformers composites the
    left half, which has that colour, over white."""
    pixels = np.zeros((40, 60, 3), dtype=np.uint8)
    pixels[:, :30] = (10, 20, 30)
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buffer, "PNG", transparency=(10, 20, 30))
    image = decode_image(buffer.getvalue(), max_pixels=10**6)
    assert image.mode == "RGB" and image.info.get("transparency") is not None
    return image


def image_bytes(image: Image.Image, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt)
    return buffer.getvalue()


def data_uri(image: Image.Image, fmt: str = "PNG") -> str:
    return support.data_uri(image_bytes(image, fmt), f"image/{fmt.lower()}")


def rows_of(item: dict[str, Any]) -> torch.Tensor:
    """The float32 rows of a response item, whatever its encoding."""
    return torch.from_numpy(support.decode_rows(item["embedding"]).copy())


def precomputed(rows: torch.Tensor) -> dict[str, Any]:
    data = base64.b64encode(rows.float().numpy().astype("<f4").tobytes()).decode()
    return {"data": data, "dtype": "float32", "shape": list(rows.shape)}


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The response is the one error shape with this status and code; returns its ``error`` object."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "code", "param", "details", "request_id"}, error
    assert error["code"] == code, error
    assert error["message"] and "Traceback" not in error["message"]
    assert error["request_id"] == response.headers["x-request-id"]
    return dict(error)


@dataclass
class LiveServer:
    url: str
    settings: Settings
    server: uvicorn.Server

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60, **kwargs)


@contextlib.contextmanager
def live_server(**settings: Any) -> Iterator[LiveServer]:
    """The real app under uvicorn on a loopback port, in a thread; yields once /ready answers 200."""
    port = free_port()
    config_settings = Settings(host="127.0.0.1", port=port, **settings)
    server = uvicorn.Server(
        uvicorn.Config(create_app(config_settings), host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, timeout=120)
        yield LiveServer(url, config_settings, server)
    finally:
        server.should_exit = True
        thread.join(timeout=60)


@contextlib.asynccontextmanager
async def asgi_client(**settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    """The real app over ``httpx.ASGITransport``, no socket: for contract tests (bodies, headers, error
    shapes) where a server adds nothing. Its lifespan runs here, as uvicorn would run it; yields once
    /ready answers 200. Streaming limits, drain, TLS and disconnects need :func:`live_server`."""
    app = create_app(Settings(**settings))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://mmencode.test", timeout=60) as client:
            deadline = time.monotonic() + 120
            while (ready := await client.get("/ready")).status_code != 200:
                if time.monotonic() > deadline or ready.json()["error"]["details"].get("phase") == "failed":
                    raise TimeoutError(f"the app is not ready: {ready.text}")
                await asyncio.sleep(0.05)
            yield client


@contextlib.contextmanager
def file_server(directory: Path) -> Iterator[str]:
    """The files of ``directory`` over HTTP on 127.0.0.1 (content types from their suffixes, as
    ``http.server`` guesses them); yields the base URL. For media URLs; the fetcher's own rules are
    tested against tests/test_fetch.py's image server."""

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(directory)))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def readme_python(section: str) -> dict[str, Any]:
    """The names the README's first python example under ``## section`` defines, run as a user runs it."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    text = readme.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```python\n(.*?)```", text, re.S)
    assert block is not None, f"README section {section!r} has no python example"
    namespace: dict[str, Any] = {}
    exec(compile(block.group(1), "README.md", "exec"), namespace)
    return namespace
