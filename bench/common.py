"""Shared pieces of the bench scripts: images, a service subprocess, a bounded async load generator
(ports, data URIs, readiness and rows come from bench/client.py, which the tests share)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson
from PIL import Image

from bench.client import free_port, wait_ready


def jpeg_images(count: int, width: int, height: int, seed: int = 0) -> list[bytes]:
    """Distinct JPEGs with some structure (gradients plus noise), like photos compress."""
    return encoded_images(count, width, height, seed, image_format="jpeg")


def encoded_images(count: int, width: int, height: int, seed: int = 0, image_format: str = "jpeg") -> list[bytes]:
    """Distinct ``jpeg`` or ``png`` files with some structure (gradients plus noise)."""
    rng = np.random.default_rng(seed)
    out = []
    y, x = np.mgrid[0:height, 0:width]
    options = {"quality": 90} if image_format == "jpeg" else {}
    for _ in range(count):
        base = (np.sin(x / rng.uniform(5, 40)) + np.cos(y / rng.uniform(5, 40))) * 60 + 128
        pixels = np.stack([base + rng.normal(0, 20, base.shape) for _ in range(3)], axis=-1)
        buffer = io.BytesIO()
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buffer, image_format.upper(), **options)
        out.append(buffer.getvalue())
    return out


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


@contextlib.contextmanager
def service(model: Path, *args: str, port: int | None = None) -> Iterator[str]:
    """``mmencode serve`` in a subprocess on loopback; yields its base URL once /ready is 200."""
    with service_process(model, *args, port=port) as (url, _):
        yield url


@contextlib.contextmanager
def service_process(model: Path, *args: str, port: int | None = None) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """:func:`service`, with the subprocess too: for a bench that reads its /proc entries."""
    port = port or free_port()
    command = [sys.executable, "-m", "mmencode", "serve", "--model", str(model), "--port", str(port), *args]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    # The log goes to a file: an unread pipe fills up and blocks the server on its next log line.
    log = tempfile.NamedTemporaryFile(prefix=f"mmencode-{port}-", suffix=".log", delete=False)  # noqa: SIM115
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process, log_path=Path(log.name))
        yield url, process
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


@dataclass
class LoadResult:
    images: int
    seconds: float
    latencies: list[float]
    statuses: dict[int, int] = field(default_factory=dict)

    @property
    def images_per_s(self) -> float:
        return self.images / self.seconds

    def summary(self) -> dict[str, Any]:
        ok = self.latencies or [float("nan")]
        return {
            "images_per_s": round(self.images_per_s, 2),
            "p50_ms": round(percentile(ok, 50) * 1000, 1),
            "p95_ms": round(percentile(ok, 95) * 1000, 1),
            "p99_ms": round(percentile(ok, 99) * 1000, 1),
            "mean_ms": round(statistics.fmean(ok) * 1000, 1),
            "statuses": self.statuses,
        }


async def drive(
    url: str, path: str, bodies: Sequence[dict[str, Any]], concurrency: int, images_per_body: int = 1
) -> LoadResult:
    """POST every body once, ``concurrency`` at a time; latency per request, throughput over the run."""
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    # The load generator shares the machine's cores with the server and should take as little of them
    # as it can: bodies are serialised up front, answers are read but not parsed, and the client is
    # aiohttp, which costs ~0.35 ms of CPU per request here where httpx cost 1.3-1.5 ms (a quarter of
    # a core at 250 requests/s, in bursts that showed up as the server's tail latency).
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(orjson.dumps(body))
    headers = {"content-type": "application/json"}
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(base_url=url, connector=connector, timeout=timeout) as session:

        async def user() -> None:
            while not queue.empty():
                body = queue.get_nowait()
                started = time.perf_counter()
                async with session.post(path, data=body, headers=headers) as response:
                    await response.read()
                elapsed = time.perf_counter() - started
                statuses[response.status] = statuses.get(response.status, 0) + 1
                if response.status == 200:
                    latencies.append(elapsed)

        started = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    return LoadResult(len(latencies) * images_per_body, seconds, latencies, statuses)


def run_load(url: str, path: str, bodies: Sequence[dict[str, Any]], concurrency: int, *, nice: int = 0) -> LoadResult:
    """:func:`drive` to the end; with ``nice`` > 0, from a thread of its own at that niceness.

    A diagnostic for a load generator that shares the server's cores: at a lower priority it yields
    them to the server, as clients on other machines would. On Linux niceness is per thread, so the
    rest of the bench (a bare pipeline in the main thread) keeps its own.
    """
    if nice <= 0:
        return asyncio.run(drive(url, path, bodies, concurrency))

    def at_lower_priority() -> LoadResult:
        os.setpriority(os.PRIO_PROCESS, 0, nice)  # 0: the calling thread, on Linux
        return asyncio.run(drive(url, path, bodies, concurrency))

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(at_lower_priority).result()


def histogram(metrics_text: str, name: str) -> dict[str, float]:
    """Cumulative bucket counts of a Prometheus histogram, by upper bound."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(metrics_text):
        if family.name == name:
            return {s.labels["le"]: s.value for s in family.samples if s.name.endswith("_bucket")}
    return {}


def bucket_distribution(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    """Per-bucket counts (not cumulative) of what happened between two scrapes."""
    out: dict[str, int] = {}
    previous = 0.0
    for bound in sorted(after, key=lambda b: float("inf") if b == "+Inf" else float(b)):
        cumulative = after[bound] - before.get(bound, 0.0)
        if cumulative - previous:
            out[f"<={bound}"] = int(cumulative - previous)
        previous = cumulative
    return out


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    """A throwaway redis-server on loopback, without persistence; yields its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed: apt-get install -y redis-server")
    port = free_port()
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        for _ in range(100):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)
