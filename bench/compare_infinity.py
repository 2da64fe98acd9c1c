"""mmencode's ``/v1/embeddings`` side by side with Infinity on the same tiny CLIP checkpoint.

    python -m bench.compare_infinity --requests 800 --concurrency 16 --image-size 640x480

Same checkpoint directory, same JPEG data URIs, same concurrency. Infinity and one mmencode per image
processor backend (``--backends``, default ``torchvision,pil``) are all started, then driven one at a
time (never two at once: they would share the two cores; an idle one costs next to nothing) in
``--rounds`` rounds, each server taking the whole set of requests once per round, the order rotated
every round. A shared VM's speed drifts by ±20 % from one minute to the next: interleaving puts every
server through the same drift, so the ratios hold where back-to-back runs would not. Each server's
figures are over all its rounds (images over seconds, percentiles over every request); the ratios of
each round are printed too. Infinity runs from its own venv, installed by ``bench/infinity/setup.sh``
when missing. The vectors differ by design (Infinity: CLIP's projected image embedding; mmencode: the
mean of the tower's rows); this compares speed.
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

from bench.client import data_uri, free_port, wait_ready
from bench.common import LoadResult, drive, jpeg_images, service

HERE = Path(__file__).resolve().parent / "infinity"
NAME = "infinity-clip"


def clip_checkpoint(root: Path) -> Path:
    """The tiny CLIP both servers load, under ``root``: built by make_clip.py (in this venv) when missing."""
    model = root / NAME
    if not (model / "tokenizer_config.json").is_file():  # Infinity needs the tokenizer, written last
        subprocess.run([sys.executable, str(HERE / "make_clip.py"), str(model)], check=True)
    return model


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


def warm(url: str, path: str, bodies: list[dict[str, Any]], concurrency: int) -> None:
    asyncio.run(drive(url, path, bodies[: 2 * concurrency], concurrency))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--image-size", default="320x240")
    parser.add_argument("--root", type=Path, default=Path(".cache/bench"))
    parser.add_argument("--venv", type=Path, default=Path("/tmp/infinity-venv"))
    parser.add_argument("--rounds", type=int, default=2, help="each server takes every request once per round")
    parser.add_argument("--backends", default="torchvision,pil", help="mmencode --image-processor-backend values")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    model = clip_checkpoint(args.root)
    width, height = (int(v) for v in args.image_size.split("x"))
    uris = [data_uri(jpeg) for jpeg in jpeg_images(args.requests, width, height, seed=9)]
    results: dict[str, Any] = {
        "requests": args.requests,
        "concurrency": args.concurrency,
        "image_size": args.image_size,
    }

    mmencode_bodies = [{"model": NAME, "input": [uri]} for uri in uris]
    servers: dict[str, tuple[str, str, list[dict[str, Any]]]] = {}  # name: (url, path, bodies)
    options = ("--served-model-name", NAME, "--cache-bytes", "0", "--max-queue", "100000", "--log-level", "warning")
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(infinity(model, args.venv))
        servers["infinity"] = (url, "/embeddings", [{"model": NAME, "modality": "image", "input": [u]} for u in uris])
        for backend in args.backends.split(","):
            url = stack.enter_context(service(model, *options, "--image-processor-backend", backend))
            servers[f"mmencode-{backend}"] = (url, "/v1/embeddings", mmencode_bodies)
        for url, path, bodies in servers.values():
            warm(url, path, bodies, args.concurrency)
        runs: dict[str, list[LoadResult]] = {name: [] for name in servers}
        names = list(servers)
        for round_index in range(args.rounds):
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                url, path, bodies = servers[name]
                runs[name].append(asyncio.run(drive(url, path, bodies, args.concurrency)))
            rates = {name: runs[name][-1].images_per_s for name in names}
            print(f"round {round_index + 1}:", {name: round(rate, 1) for name, rate in rates.items()}, flush=True)

    for name, results_of in runs.items():
        results[name] = merged(results_of).summary()
        results[name]["rounds_images_per_s"] = [round(r.images_per_s, 2) for r in results_of]
    theirs = results["infinity"]
    for name in names[1:]:
        ours = results[name]
        ours["throughput_ratio"] = round(ours["images_per_s"] / theirs["images_per_s"], 2)
        ours["p99_ratio"] = round(ours["p99_ms"] / theirs["p99_ms"], 2)
        ours["rounds_throughput_ratio"] = [
            round(a / b, 2) for a, b in zip(ours["rounds_images_per_s"], theirs["rounds_images_per_s"], strict=True)
        ]
    for name in names:
        print(name, json.dumps(results[name]), flush=True)
    for name in names[1:]:
        ours = results[name]
        print(f"{name}/infinity images/s", ours["throughput_ratio"], "p99 ratio", ours["p99_ratio"],
              "per round", ours["rounds_throughput_ratio"])  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


def merged(results: list[LoadResult]) -> LoadResult:
    """Several runs of one server as one: images over seconds, every request's latency."""
    statuses: dict[int, int] = {}
    for result in results:
        for status, count in result.statuses.items():
            statuses[status] = statuses.get(status, 0) + count
    return LoadResult(
        sum(r.images for r in results),
        sum(r.seconds for r in results),
        [latency for r in results for latency in r.latencies],
        statuses,
    )


if __name__ == "__main__":
    main()
