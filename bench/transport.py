"""Transport cost of real-size rows: base64 JSON against safetensors, with and without kept payloads.

    .venv/bin/python -m bench.transport [--repeats 20] [--images 3]

The checkpoint (built once into ``.cache/bench/qwen2vl-7b-geometry``) is a Qwen2-VL vision tower with
Qwen2-VL-7B's output geometry: patch 14, spatial merge 2, temporal patch 2, merger output width 3584,
and Qwen2-VL-7B-Instruct's processor pixel limits (3136 to 12845056), so one 1920x1080 image is 2,691
rows x 3,584; tiny in depth (1 block) and inner width (32), so it runs on a CPU.

For each format (base64 JSON float32/bfloat16, safetensors float32/bfloat16) it prints:

- response bytes of one image's answer;
- server CPU ms per answer: the server process's CPU time (every thread, from /proc/<pid>/task/*/schedstat)
  around requests that name the image by ``hash`` (so the request itself costs almost nothing), divided
  by the number of requests. ``first`` is the first answer in that format for rows already cached
  (the rows are encoded to the wire and the payload is kept); ``hit`` repeats it (the kept payload is
  sent as it is). ``encode`` is the same as ``first`` timed in this process around the renderer alone;
- client ms to decode the body into arrays: ``orjson`` + ``base64`` + ``numpy.frombuffer`` against
  ``safetensors.numpy.load`` for float32; into torch tensors (``torch.frombuffer`` against
  ``safetensors.torch.load``) for bfloat16, which numpy has no dtype for.

Also the miss (the encoder runs, wall ms on this machine's CPU) for reference. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import safetensors.numpy
import safetensors.torch
import torch
from transformers import Qwen2VLVisionConfig

from bench.checkpoints import qwen2_vl_tower
from bench.client import data_uri, free_port, wait_ready
from bench.common import jpeg_images, percentile
from mmencode.app.api.encode.response import render_encode_response

FORMATS = [
    ("base64 JSON float32", "base64", "float32"),
    ("base64 JSON bfloat16", "base64", "bfloat16"),
    ("safetensors float32", "safetensors", "float32"),
    ("safetensors bfloat16", "safetensors", "bfloat16"),
]


def build_checkpoint(directory: Path) -> Path:
    if (directory / "config.json").is_file():
        return directory
    config = Qwen2VLVisionConfig(
        depth=1, embed_dim=32, num_heads=1, hidden_size=3584, mlp_ratio=2,
        patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
    )  # fmt: skip
    # Qwen2-VL-7B-Instruct's own pixel limits: one 1920x1080 image is 2,691 rows.
    return qwen2_vl_tower(directory, config, min_pixels=3136, max_pixels=12845056)


@contextlib.contextmanager
def server(model: Path, *args: str) -> Iterator[tuple[str, int]]:
    """``mmencode serve`` on loopback; yields its URL and process id (for its CPU time)."""
    port = free_port()
    command = [sys.executable, "-m", "mmencode", "serve", "--model", str(model), "--port", str(port), *args]
    log = tempfile.NamedTemporaryFile(prefix=f"mmencode-{port}-", suffix=".log", delete=False)  # noqa: SIM115
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process, log_path=Path(log.name))
        yield url, process.pid
    finally:
        process.terminate()
        process.wait(timeout=60)
        log.close()


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of ``pid`` so far, in seconds (nanosecond counters from schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def server_cpu_ms(client: httpx.Client, pid: int, bodies: list[dict[str, Any]], expect: str) -> float:
    """Server CPU ms per request, over ``bodies`` sent one after another."""
    before = cpu_seconds(pid)
    for body in bodies:
        response = client.post("/v1/encode", json=body)
        assert response.status_code == 200, response.text[:500]
        assert response.headers["content-type"].startswith(expect), response.headers["content-type"]
    return (cpu_seconds(pid) - before) * 1000 / len(bodies)


def decode_json(body: bytes, as_numpy: bool) -> Any:
    embedding = orjson.loads(body)["items"][0]["embedding"]
    raw = base64.b64decode(embedding["data"])
    if as_numpy:
        return np.frombuffer(raw, dtype="<f4").reshape(embedding["shape"])
    return torch.frombuffer(bytearray(raw), dtype=torch.bfloat16).reshape(embedding["shape"])


def decode_safetensors(body: bytes, as_numpy: bool) -> Any:
    if as_numpy:
        return safetensors.numpy.load(body)["items.0"]
    return safetensors.torch.load(body)["items.0"]


def timed_ms(function: Callable[[], Any], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path(".cache/bench"), help="where the checkpoint is built")
    parser.add_argument("--repeats", type=int, default=20, help="hits per format (and client decodes)")
    parser.add_argument("--images", type=int, default=3, help="distinct cached images for first answers")
    args = parser.parse_args()
    checkpoint = build_checkpoint(args.root / "qwen2vl-7b-geometry")
    jpegs = jpeg_images(args.images, 1920, 1080, seed=7)
    rows: dict[str, Any] = {}
    with (
        server(checkpoint, "--cache-bytes", "4GiB", "--log-level", "warning") as (url, pid),
        httpx.Client(base_url=url, timeout=600) as client,
    ):
        hashes, miss_ms = [], []
        for jpeg in jpegs:
            # Mean-pooled floats: the rows are cached, and no payload of a measured format is kept.
            started = time.perf_counter()
            answer = client.post(
                "/v1/encode", json={"items": [{"image": data_uri(jpeg)}], "encoding_format": "float", "pooling": "mean"}
            ).json()
            miss_ms.append((time.perf_counter() - started) * 1000)
            hashes.append(answer["items"][0]["hash"])
            shape = (answer["items"][0]["num_tokens"], answer["items"][0]["embedding"]["shape"][1])
        cached_rows = torch.from_numpy(
            safetensors.numpy.load(
                client.post(
                    "/v1/encode", json={"items": [{"hash": hashes[0]}], "encoding_format": "safetensors"}
                ).content
            )["items.0"].copy()
        )
        for label, fmt, dtype in FORMATS:
            expect = "application/json" if fmt == "base64" else "application/vnd.safetensors"
            bodies = [{"items": [{"hash": h}], "encoding_format": fmt, "dtype": dtype} for h in hashes]
            first = server_cpu_ms(client, pid, bodies, expect)
            hit = server_cpu_ms(client, pid, bodies[:1] * args.repeats, expect)
            body = client.post("/v1/encode", json=bodies[0]).content
            as_numpy = dtype == "float32"
            decode = decode_json if fmt == "base64" else decode_safetensors
            result = decode(body, as_numpy)
            assert tuple(result.shape) == shape
            client_ms = timed_ms(lambda body=body, decode=decode, as_numpy=as_numpy: decode(body, as_numpy), 5)
            render = _renderer(cached_rows, fmt, dtype)
            rows[label] = {
                "bytes": len(body),
                "server_cpu_ms_first": first,
                "server_cpu_ms_hit": hit,
                "encode_ms_in_process": timed_ms(render, 5),
                "client_decode_ms": client_ms,
            }
    print(f"1920x1080 JPEG -> {shape[0]} rows x {shape[1]} (Qwen2-VL-7B geometry); miss p50 "
          f"{percentile(miss_ms, 50):.0f} ms wall (tiny-depth tower on this CPU)")  # fmt: skip
    print(f"{'format':<22} {'bytes':>12} {'srv cpu first':>14} {'srv cpu hit':>12} {'encode':>10} {'decode':>10}")
    for label, row in rows.items():
        print(
            f"{label:<22} {row['bytes']:>12,} {row['server_cpu_ms_first']:>11.1f} ms "
            f"{row['server_cpu_ms_hit']:>9.1f} ms {row['encode_ms_in_process']:>7.1f} ms "
            f"{row['client_decode_ms']:>7.1f} ms"
        )
    print("srv cpu: server process CPU per answer (first in a format / kept payload); encode: the renderer in")
    print("this process, no kept payload; decode: client, body to arrays")


class _Result:
    """What the renderer reads of a scheduler result."""

    def __init__(self, rows: torch.Tensor) -> None:
        self.rows = rows
        self.hash = None


def _renderer(rows: torch.Tensor, fmt: str, dtype: str) -> Callable[[], bytes]:
    """The route's renderer on cached rows, without a kept payload: the cost of a first answer."""

    def render() -> bytes:
        item = {"index": 0, "source": "cache", "hash": None, "num_tokens": int(rows.shape[0]), "metadata": {}}
        answer = {"id": "enc-bench", "model": "bench", "items": [item], "usage": {}}
        results: list[Any] = [_Result(rows)]
        return render_encode_response(answer, results, encoding_format=fmt, dtype=dtype, pooling="none", memo=None)

    return render


if __name__ == "__main__":
    main()
