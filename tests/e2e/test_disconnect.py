"""A client that hangs up cancels its request's work: here, the image fetch it was waiting on.

The image URL points at a server that accepts the connection and never answers. When the client of
mmencode goes away, mmencode must drop that fetch (the image server sees its connection closed) instead
of holding it until the fetch timeout, and count the disconnect.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import LiveServer, live_server


class SilentImageServer:
    """Accepts connections and reads the request, then says nothing; notes when the peer closes."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = threading.Event()
        self.closed_by_peer = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        connection, _ = self.sock.accept()
        self.accepted.set()
        with connection:
            connection.settimeout(30)
            try:
                while connection.recv(65536):
                    pass
                self.closed_by_peer.set()  # recv() returned b"": the fetcher closed its end
            except OSError:
                self.closed_by_peer.set()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def silent() -> Iterator[SilentImageServer]:
    server = SilentImageServer()
    yield server
    server.close()


@pytest.fixture(scope="module")
def server(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(
        model=checkpoints["qwen2_vl"],
        cache_dir=tmp_path_factory.mktemp("cache"),
        allowed_url_hosts=["127.0.0.1"],
        url_fetch_timeout=60,
        request_timeout=60,
    ) as live:
        yield live


def _disconnects(server: LiveServer) -> float:
    for line in httpx.get(server.url + "/metrics").text.splitlines():
        if line.startswith("mmencode_client_disconnects_total "):
            return float(line.split()[1])
    raise AssertionError("mmencode_client_disconnects_total is not exported")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/encode", lambda url: {"items": [{"image": url}]}),
        ("/v1/embeddings", lambda url: {"model": "qwen2_vl", "input": [url]}),
    ],
    ids=["encode", "embeddings"],
)
def test_a_client_that_hangs_up_cancels_its_fetch(
    server: LiveServer, silent: SilentImageServer, path: str, body: Callable[[str], dict[str, Any]]
) -> None:
    before = _disconnects(server)
    url = f"http://127.0.0.1:{silent.port}/cat.png"
    impatient = httpx.Client(base_url=server.url, timeout=httpx.Timeout(60, read=1))
    with pytest.raises(httpx.ReadTimeout), impatient:
        impatient.post(path, json=body(url))  # gives up after 1 s and closes its connection
    assert silent.accepted.is_set()  # the fetch had started
    # Well before the 60 s fetch timeout, mmencode closed its side of the fetch.
    assert silent.closed_by_peer.wait(10), "the fetch was not cancelled when the client left"
    deadline = time.monotonic() + 10
    while _disconnects(server) < before + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _disconnects(server) == before + 1
    # The server serves on.
    assert httpx.get(server.url + "/ready").status_code == 200
