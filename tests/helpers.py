"""The tests' helpers, in one module: images and data URIs, the real app on a loopback port or over ASGI,
a file server, wire decoding, and the real outside services (redis-server, HAProxy, mmencode replicas as
processes on loopback).

What a client of mmencode does (a free port, data URIs, waiting for readiness, decoding rows) and the
synthetic media (clips, sounds) live in ``bench/client.py`` and ``bench/media.py``, which the bench
scripts use too; they are re-exported here, so the tests import from one place.

The services' binaries come from the distribution's packages (``.ci/run`` installs them). Outside CI a
missing binary skips the test that needs it, with the install command; under CI it fails the test.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import io
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
import uvicorn
from PIL import Image

from bench import client
from bench.client import bare_base64 as bare_base64
from bench.client import decode_rows as decode_rows
from bench.client import free_port as free_port
from bench.client import wait_ready as wait_ready
from bench.media import as_float as as_float
from bench.media import audio_data_uri as audio_data_uri
from bench.media import clip as clip
from bench.media import clip_frames as clip_frames
from bench.media import encoded as encoded
from bench.media import tone as tone
from bench.media import video_data_uri as video_data_uri
from bench.media import wav as wav
from mmencode.app.config import Settings
from mmencode.app.media.image import decode_image
from mmencode.app.server import create_app


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
    return client.data_uri(image_bytes(image, fmt), f"image/{fmt.lower()}")


def rows_of(item: dict[str, Any]) -> torch.Tensor:
    """The float32 rows of a response item, whatever its encoding."""
    return torch.from_numpy(client.decode_rows(item["embedding"]).copy())


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
    tested against tests/unit/media/test_fetch.py's image server."""

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


def docs_text() -> str:
    """What a reader has: the README and every page of docs/, one after the other."""
    root = Path(__file__).resolve().parents[1]
    return "\n".join(path.read_text() for path in [root / "README.md", *sorted((root / "docs").glob("*.md"))])


def readme_python(section: str) -> dict[str, Any]:
    """The names the first python example under ``## section`` (of the README or a page of docs/) defines,
    run as a user runs it."""
    text = docs_text().split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```python\n(.*?)```", text, re.S)
    assert block is not None, f"section {section!r} has no python example"
    namespace: dict[str, Any] = {}
    exec(compile(block.group(1), f"{section}.md", "exec"), namespace)
    return namespace


# ----- real outside services on loopback -----
# The Docker image's uid: the tests run as another user (root in CI) and read what mmencode wrote as this one.
IMAGE_UID = 10001


def require_binary(name: str, package: str) -> str:
    path = shutil.which(name) or next(
        (str(p) for p in (Path("/usr/sbin") / name, Path("/usr/bin") / name) if p.is_file()), None
    )
    if path is None:
        message = f"{name} is not installed: apt-get install -y {package} (.ci/run does)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


@dataclass
class RedisServer:
    """``redis-server`` on a loopback port, without persistence, as the README recommends for the cache."""

    binary: str
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        args += ["--maxmemory", "256mb", "--maxmemory-policy", "allkeys-lru", "--daemonize", "no"]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port)

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None

    def pause(self) -> None:
        """Still accepting connections, never answering: a hung or overloaded server."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    @contextlib.contextmanager
    def running(self) -> Iterator[RedisServer]:
        self.start()
        try:
            yield self
        finally:
            if self.process is not None:
                self.process.send_signal(signal.SIGCONT)
            self.kill()


@dataclass
class Replica:
    """One ``mmencode serve`` process: what an operator runs per GPU."""

    args: list[str]
    env: dict[str, str]
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        command = [sys.executable, "-m", "mmencode", "serve", "--port", str(self.port), *self.args]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", **self.env}
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def wait_ready(self, timeout: float = 120) -> None:
        wait_ready(self.url, timeout=timeout)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


def python_as(uid: int, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python3 -c code args`` as another uid and group, no supplementary groups (needs root and setpriv)."""
    return subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "/usr/bin/env", "python3", "-c", code, *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@contextlib.contextmanager
def haproxy_serving(
    config_files: list[Path], *, env: dict[str, str], port: int, cwd: Path | None = None
) -> Iterator[str]:
    """Real haproxy on the given config files, checked first (``-c``), until the block ends; yields its URL."""
    binary = require_binary("haproxy", "haproxy")
    command = [binary, *(part for path in config_files for part in ("-f", str(path)))]
    subprocess.run([*command, "-c", "-q"], env=env, cwd=cwd, check=True)
    process = subprocess.Popen(
        [*command, "-db"], env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_port(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)


# ----- mmencode as a user installs it -----
PLAIN_VENV = Path(__file__).resolve().parents[1] / ".venv-plain"


def plain_mmencode() -> Path:
    """``mmencode`` from .venv-plain (``pip install ".[video,audio]"`` and nothing else, ``make plain-env``);
    a missing environment fails under CI (CI=true) and skips elsewhere."""
    executable = PLAIN_VENV / "bin" / "mmencode"
    if not (PLAIN_VENV / ".installed").is_file() or not executable.is_file():
        message = f"{PLAIN_VENV} is missing: build it with `make plain-env` (make test does)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return executable


@contextlib.contextmanager
def mmencode_process(
    executable: Path,
    *args: str,
    log: Path,
    port: int | None = None,
    started: Callable[[subprocess.Popen[bytes]], None] | None = None,
) -> Iterator[str]:
    """``executable serve *args`` on a loopback port (``port``, or a free one), its log in ``log``; yields its
    URL once /ready is 200. ``started`` is given the process (its own process group) as soon as it runs."""
    port = port or free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [str(executable), "serve", "--host", "127.0.0.1", "--port", str(port), *args],
            stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
    if started is not None:
        started(process)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process, log_path=log)
        yield url
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=30)


class FakeConsumer:
    """vLLM 0.32's ``ECMooncakeConnector`` consumer as the producer sees it, in process: one ZMQ REP control
    socket per shard on loopback (``peers``, ``reserve``/``reserve_batch``, ``complete``/``complete_batch``,
    ``cancel``, ``status``, the reply shapes of vLLM's ``control.py``) and a receive pool per shard registered
    with a real Mooncake transfer engine, so a push's bytes really land. For tests without a vLLM:
    ``tests/vllm_server/test_mooncake.py`` pushes into the real one.

    Faults: ``refuse`` (a reserve's error text, as vLLM's "EC consumer buffer pool is full"), ``lose_on_complete``
    (completion answers ``completed: false``, as for an expired or cancelled reservation), ``silent`` (no
    answer at all, as a consumer that hangs). ``calls`` records every request, with its shard index.
    """

    def __init__(self, shards: int = 1, pool_bytes: int = 1 << 20) -> None:
        try:
            from mooncake.engine import TransferEngine
        except ImportError as exc:  # the test extra's package, or the libraries it loads, missing
            message = (
                f"Mooncake's transfer engine does not import ({exc}): `make` installs the mooncake extra, "
                "`make system-deps` the libraries it loads"
            )
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(message)
            pytest.skip(message)

        os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
        self.engine = TransferEngine()
        assert self.engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        self.session = f"127.0.0.1:{self.engine.get_rpc_port()}"
        self.pools = [torch.zeros(pool_bytes, dtype=torch.uint8) for _ in range(shards)]
        for pool in self.pools:
            assert self.engine.register_memory(pool.data_ptr(), pool.nbytes) == 0
        self.used = [0] * shards
        self.ports = [free_port() for _ in range(shards)]
        self.reservations: dict[tuple[int, str], dict[str, Any]] = {}
        self.calls: list[tuple[int, dict[str, Any]]] = []
        self.refuse: str | None = None
        self.lose_on_complete = False
        self.silent = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._serve, args=(s,), daemon=True) for s in range(shards)]
        for thread in self._threads:
            thread.start()

    @property
    def control(self) -> str:
        return f"tcp://127.0.0.1:{self.ports[0]}"

    def rows(self, transfer_id: str, shard: int = 0) -> torch.Tensor:
        """The bytes the pool holds for a reservation, as its dtype and shape."""
        record = self.reservations[shard, transfer_id]
        raw = self.pools[shard][record["offset"] : record["offset"] + record["nbytes"]]
        return raw.view(getattr(torch, record["dtype"])).reshape(record["shape"]).clone()

    def states(self, shard: int = 0) -> dict[str, str]:
        with self._lock:
            return {tid: r["state"] for (s, tid), r in self.reservations.items() if s == shard}

    def reset(self) -> None:
        """Empty pools, no reservations, no faults: as started (for a consumer shared by tests)."""
        with self._lock:
            self.reservations.clear()
            self.calls.clear()
            self.used = [0] * len(self.pools)
            self.refuse, self.lose_on_complete, self.silent = None, False, False

    def ops(self) -> list[str]:
        return [payload["op"] for _, payload in self.calls]

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        for pool in self.pools:
            self.engine.unregister_memory(pool.data_ptr())

    def __enter__(self) -> FakeConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _serve(self, shard: int) -> None:
        import zmq

        context = zmq.Context()
        socket_ = context.socket(zmq.REP)
        socket_.setsockopt(zmq.LINGER, 0)
        socket_.bind(f"tcp://127.0.0.1:{self.ports[shard]}")
        poller = zmq.Poller()
        poller.register(socket_, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                if self.silent:  # a hung consumer: requests wait, unread
                    time.sleep(0.05)
                    continue
                if not poller.poll(50):
                    continue
                request = socket_.recv_json()
                assert isinstance(request, dict)
                self.calls.append((shard, request))
                try:
                    reply = {"ok": True, "result": self._handle(shard, request)}
                except Exception as exc:
                    reply = {"ok": False, "error": str(exc)}
                socket_.send_json(reply)
        finally:
            socket_.close(linger=0)
            context.term()

    def _handle(self, shard: int, request: dict[str, Any]) -> Any:
        op = request["op"]
        with self._lock:
            if op == "peers":
                return {"ports": self.ports}
            if op in ("reserve", "reserve_batch"):
                items = request["items"] if op == "reserve_batch" else [request]
                answers = []
                for item in items:
                    try:
                        answers.append({"ok": True, "result": self._reserve(shard, item)})
                    except Exception as exc:
                        answers.append({"ok": False, "error": str(exc)})
                if op == "reserve_batch":
                    return {"items": answers}
                if not answers[0]["ok"]:
                    raise RuntimeError(answers[0]["error"])
                return answers[0]["result"]
            if op in ("complete", "complete_batch"):
                items = request["items"] if op == "complete_batch" else [request]
                done = [self._complete(shard, item) for item in items]
                return {"items": done} if op == "complete_batch" else done[0]
            if op == "cancel":
                record = self.reservations.get((shard, request["transfer_id"]))
                if record is not None:
                    record["state"] = "CANCELLED"
                return {"cancelled": True}
            if op == "status":
                record = self.reservations.get((shard, request["transfer_id"]))
                if record is None or record["state"] in ("CANCELLED", "EXPIRED"):
                    return None
                return {"mm_hash": record["mm_hash"], "ready": record["state"] == "READY"}
            raise ValueError(f"unknown control op: {op!r}")

    def _reserve(self, shard: int, item: dict[str, Any]) -> dict[str, Any]:
        if self.refuse is not None:
            raise RuntimeError(self.refuse)
        dtype = getattr(torch, item["dtype"])
        if int(np.prod(item["shape"])) * dtype.itemsize != item["nbytes"]:
            raise ValueError("shape and dtype do not match nbytes")
        held = [r for (s, _), r in self.reservations.items() if s == shard and r["mm_hash"] == item["mm_hash"]]
        ready = next((r for r in held if r["state"] == "READY"), None)
        writing = next((r for r in held if r["state"] == "WRITING" and not r["follows"]), None)
        source = ready or writing
        if source is None:
            offset = self.used[shard]
            if offset + item["nbytes"] > self.pools[shard].nbytes:
                raise RuntimeError("EC consumer buffer pool is full")
            self.used[shard] = offset + -(-item["nbytes"] // 64) * 64
        else:
            offset = source["offset"]
        record = {
            **item,
            "state": "READY" if ready is not None else "WRITING",
            "offset": offset,
            "reservation_id": os.urandom(8).hex(),
            "follows": writing["transfer_id"] if writing is not None and source is writing else None,
        }
        self.reservations[shard, item["transfer_id"]] = record
        return {
            "reservation_id": record["reservation_id"],
            "dst_session": self.session,
            "dst_ptr": self.pools[shard].data_ptr() + offset,
            "nbytes": item["nbytes"],
            "write": source is None,
            "ready": ready is not None,
            "cached": ready is not None,
        }

    def _complete(self, shard: int, item: dict[str, Any]) -> dict[str, bool]:
        record = self.reservations.get((shard, item["transfer_id"]))
        if self.lose_on_complete or record is None or record["reservation_id"] != item["reservation_id"]:
            return {"completed": False, "became_ready": False}
        record["state"] = "READY"
        for follower in self.reservations.values():
            if follower["follows"] == record["transfer_id"] and follower["state"] == "WRITING":
                follower["state"] = "READY"
        return {"completed": True, "became_ready": True}
