"""mmencode's ``/v1/embeddings`` side by side with Infinity on the same tiny CLIP checkpoint.

    python -m bench.compare_infinity --requests 400 --concurrency 32

Same checkpoint directory, same JPEG data URIs, same concurrency, one server at a time on loopback
(never both at once: they would share the two cores). Infinity runs from its own venv, installed by
``bench/infinity/setup.sh`` when missing. The vectors differ by design (Infinity: CLIP's projected
image embedding; mmencode: the mean of the tower's rows); this compares speed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import drive, jpeg_images, service
from tests.support import data_uri, free_port, wait_ready

HERE = Path(__file__).resolve().parent / "infinity"
NAME = "infinity-clip"


@contextlib.contextmanager
def infinity(model: Path, venv: Path) -> Iterator[str]:
    if not (venv / "bin" / "infinity_emb").exists():
        subprocess.run(["bash", str(HERE / "setup.sh"), str(venv)], check=True)
    port = free_port()
    pidfile = Path(tempfile.mkdtemp()) / "infinity.pid"
    log = tempfile.NamedTemporaryFile(prefix="infinity-", suffix=".log", delete=False)  # noqa: SIM115
    process = subprocess.Popen(
        ["bash", str(HERE / "serve.sh"), str(model), str(port), str(venv)],
        env={**os.environ, "INFINITY_PIDFILE": str(pidfile)},
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        # Infinity's /health answers 200 once its model is loaded and warmed up.
        wait_ready(url, process, timeout=300, log_path=Path(log.name), path="/health")
        yield url
    finally:
        with contextlib.suppress(Exception):
            os.kill(int(pidfile.read_text()), signal.SIGTERM)
        process.wait(timeout=60)


def run(url: str, path: str, bodies: list[dict[str, Any]], concurrency: int) -> dict[str, Any]:
    asyncio.run(drive(url, path, bodies[:8], 4))  # warm-up
    return asyncio.run(drive(url, path, bodies, concurrency)).summary()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--image-size", default="320x240")
    parser.add_argument("--root", type=Path, default=Path(".cache/bench"))
    parser.add_argument("--venv", type=Path, default=Path("/tmp/infinity-venv"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    model = args.root / NAME
    if not (model / "tokenizer_config.json").is_file():
        subprocess.run([sys.executable, str(HERE / "make_clip.py"), str(model)], check=True)
    width, height = (int(v) for v in args.image_size.split("x"))
    uris = [data_uri(jpeg) for jpeg in jpeg_images(args.requests, width, height, seed=9)]
    results: dict[str, Any] = {
        "requests": args.requests,
        "concurrency": args.concurrency,
        "image_size": args.image_size,
    }

    with infinity(model, args.venv) as url:
        bodies = [{"model": NAME, "modality": "image", "input": [uri]} for uri in uris]
        results["infinity"] = run(url, "/embeddings", bodies, args.concurrency)
    print("infinity", json.dumps(results["infinity"]), flush=True)

    options = ("--served-model-name", NAME, "--cache-bytes", "0", "--max-queue", "100000", "--log-level", "warning")
    with service(model, *options) as url:
        bodies = [{"model": NAME, "input": [uri]} for uri in uris]
        results["mmencode"] = run(url, "/v1/embeddings", bodies, args.concurrency)
    print("mmencode", json.dumps(results["mmencode"]), flush=True)

    ours, theirs = results["mmencode"], results["infinity"]
    results["throughput_ratio"] = round(ours["images_per_s"] / theirs["images_per_s"], 2)
    results["p99_ratio"] = round(ours["p99_ms"] / theirs["p99_ms"], 2)
    print("mmencode/infinity images/s", results["throughput_ratio"], "p99 ratio", results["p99_ratio"])
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
