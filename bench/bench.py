"""Service throughput and latency against the bare pipeline, measured in one run.

    python -m bench.bench --checkpoint mid --concurrency 32 --requests 160

Phases (``--phases``): ``bare`` decodes, preprocesses and encodes in this process at each batch size
and keeps the best; ``service`` drives ``mmencode serve`` (a subprocess on loopback, cache off) with
an async httpx load generator; ``paired`` takes the two in turns for ``--rounds`` rounds, so both
see the same machine, and says whether a gap is a slower forward or an encoder left waiting
(``--loadgen-nice`` runs its load generator at a lower priority, to tell its share of the cores);
``overlap`` the service with ``--no-exclusive-forward``; ``nobatch`` does the same with
``--max-batch-items 1``; ``cache`` compares a miss with a hit of the same image, sequentially, and
gives the hit p50 in absolute terms for a ~1 MB JPEG (1600x1200) sent as a data URI as well.
Bounded by the request count; loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import torch

from bench.checkpoints import build_checkpoint
from bench.client import data_uri
from bench.common import (
    bucket_distribution,
    drive,
    encoded_images,
    histogram,
    jpeg_images,
    percentile,
    run_load,
    service,
    service_process,
)
from bench.server_times import ServerTimes, gauge_value
from mmencode.app.engine.engine import resolve_device
from mmencode.app.media.image import decode_image
from mmencode.app.process.malloc import keep_large_blocks_in_heap
from mmencode.models import EncoderAdapter, load_encoder
from mmencode.models.processor_backend import BackendChoice

_SERVICE_OPTIONS = ("--cache-bytes", "0", "--max-queue", "100000", "--request-timeout", "600", "--log-level", "warning")


def warm_adapter(checkpoint: Path, image: bytes, dtype: torch.dtype, backend: BackendChoice = "auto") -> EncoderAdapter:
    """The checkpoint's encoder in this process, after one forward (which pays for first-call set-up)."""
    adapter = load_encoder(checkpoint, device=resolve_device(None), dtype=dtype, image_processor_backend=backend)
    adapter.forward([adapter.preprocess(decode_image(image, max_pixels=10**9))])
    return adapter


@contextlib.contextmanager
def warm_service(
    checkpoint: Path, bodies: list[dict[str, Any]], concurrency: int, *args: str
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``mmencode serve`` with the cache off and no queue limit in the way, after a few warm-up requests;
    yields its URL and its process."""
    with service_process(checkpoint, *_SERVICE_OPTIONS, *args) as (url, process):
        asyncio.run(drive(url, "/v1/encode", bodies[: min(8, len(bodies))], min(4, concurrency)))
        yield url, process


def bare_pipeline(
    checkpoint: Path, images: list[bytes], batch_sizes: list[int], dtype: torch.dtype, backend: BackendChoice = "auto"
) -> dict[str, Any]:
    """Decode, preprocess and encode in this process, one batch after another: the service's ceiling."""
    adapter = warm_adapter(checkpoint, images[0], dtype, backend)
    per_batch: dict[int, float] = {}
    for size in batch_sizes:
        count = max(size, len(images) // size * size)
        started = time.perf_counter()
        for start in range(0, count, size):
            chunk = [images[i % len(images)] for i in range(start, start + size)]
            adapter.forward([adapter.preprocess(decode_image(j, max_pixels=10**9)) for j in chunk])
        per_batch[size] = count / (time.perf_counter() - started)
    best = max(per_batch, key=lambda size: per_batch[size])
    return {
        "images_per_s_by_batch": {k: round(v, 2) for k, v in per_batch.items()},
        "best_batch": best,
        "images_per_s": round(per_batch[best], 2),
    }


def paired_rounds(
    checkpoint: Path,
    images: list[bytes],
    uris: list[str],
    concurrency: int,
    batch: int,
    rounds: int,
    loadgen_nice: int = 0,
    backend: BackendChoice = "auto",
) -> dict[str, Any]:
    """Bare pipeline and service taken in turns, round after round, over the same images.

    On a VM whose speed drifts by minutes, a bare phase and a service phase a minute apart compare two
    machines; in turns, both see the same drift. The server idles while the bare pipeline runs, and
    the other way round. The ratio is of the totals over every round.
    """
    adapter = warm_adapter(checkpoint, images[0], torch.float32, backend)
    bodies = [{"items": [{"image": uri}]} for uri in uris]
    bare_images, bare_seconds, bare_forward_seconds, served, served_seconds = 0, 0.0, 0.0, 0, 0.0
    encoder_seconds = 0.0
    per_round = []
    with warm_service(checkpoint, bodies, concurrency, "--image-processor-backend", backend) as (url, _):
        for _ in range(rounds):
            count = max(batch, len(images) // 2 // batch * batch)
            started = time.perf_counter()
            for start in range(0, count, batch):
                prepared = [
                    adapter.preprocess(decode_image(j, max_pixels=10**9)) for j in images[start : start + batch]
                ]
                forward_started = time.perf_counter()
                adapter.forward(prepared)
                bare_forward_seconds += time.perf_counter() - forward_started
            bare = time.perf_counter() - started
            before = httpx.get(url + "/metrics").text
            result = run_load(url, "/v1/encode", bodies, concurrency, nice=loadgen_nice)
            after = httpx.get(url + "/metrics").text
            encoder_seconds += ServerTimes.between(before, after).encoder_s_total
            bare_images, bare_seconds = bare_images + count, bare_seconds + bare
            served, served_seconds = served + result.images, served_seconds + result.seconds
            per_round.append(round((result.images / result.seconds) / (count / bare), 3))
    return {
        "batch": batch,
        "rounds": rounds,
        "bare_images_per_s": round(bare_images / bare_seconds, 2),
        "service_images_per_s": round(served / served_seconds, 2),
        "service_over_bare": round((served / served_seconds) / (bare_images / bare_seconds), 3),
        "service_over_bare_by_round": per_round,
        # Where a gap comes from: a slower forward (work beside it on the same cores), or the encoder
        # waiting between forwards. Bare, the forward is timed alone; its preprocessing is the rest.
        "bare_forward_ms_per_image": round(bare_forward_seconds / bare_images * 1000, 1),
        "service_forward_ms_per_image": round(encoder_seconds / served * 1000, 1),
        "bare_forward_share": round(bare_forward_seconds / bare_seconds, 3),
        "service_encoder_busy": round(encoder_seconds / served_seconds, 3),
        "loadgen_nice": loadgen_nice,
        # What the service's start-up calibration gave its forward (app/engine/cpu_threads.py): one thread for
        # the mid tower halves its throughput, and the ratio with it.
        "service_forward_threads": gauge_value(after, "mmencode_cpu_forward_threads"),
    }


def service_load(checkpoint: Path, uris: list[str], concurrency: int, *args: str) -> dict[str, Any]:
    bodies = [{"items": [{"image": uri}]} for uri in uris]
    with warm_service(checkpoint, bodies, concurrency, *args) as (url, _):
        before = httpx.get(url + "/metrics").text
        result = asyncio.run(drive(url, "/v1/encode", bodies, concurrency))
        after = httpx.get(url + "/metrics").text
    summary = result.summary()
    summary["batch_items"] = bucket_distribution(
        histogram(before, "mmencode_batch_items"), histogram(after, "mmencode_batch_items")
    )
    return summary


def cache_latency(
    checkpoint: Path, images: list[bytes], count: int, mime: str = "image/jpeg", large_count: int = 5
) -> dict[str, Any]:
    """Miss and hit p50 of the same images one after another; and the same for ~1 MB JPEGs."""
    large = jpeg_images(large_count, 1600, 1200, seed=1)
    with service(checkpoint, "--log-level", "warning") as url, httpx.Client(base_url=url, timeout=600) as client:
        warm_up = jpeg_images(1, 64, 64, seed=99)[0]  # never among the measured images
        client.post("/v1/encode", json={"items": [{"image": data_uri(warm_up)}]})
        misses, hits = _miss_then_hit(client, images[:count], repeats=1, mime=mime)
        large_misses, large_hits = _miss_then_hit(client, large, repeats=4, mime="image/jpeg")
    miss, hit = percentile(misses, 50), percentile(hits, 50)
    return {
        "miss_p50_ms": round(miss * 1000, 2),
        "hit_p50_ms": round(hit * 1000, 2),
        "speedup": round(miss / hit, 1),
        "large_image_bytes": round(statistics.fmean(len(j) for j in large)),
        "large_miss_p50_ms": round(percentile(large_misses, 50) * 1000, 2),
        "large_hit_p50_ms": round(percentile(large_hits, 50) * 1000, 2),
    }


def _miss_then_hit(
    client: httpx.Client, images: list[bytes], repeats: int, mime: str
) -> tuple[list[float], list[float]]:
    """Each image once (a miss), then ``repeats`` times again (hits); latencies in seconds."""
    misses, hits = [], []
    for image in images:
        body = orjson.dumps({"items": [{"image": data_uri(image, mime)}]})
        for bucket, source in ((misses, "encoder"), *[(hits, "cache")] * repeats):
            started = time.perf_counter()
            response = client.post("/v1/encode", content=body, headers={"content-type": "application/json"})
            bucket.append(time.perf_counter() - started)
            assert response.json()["items"][0]["source"] == source, response.text
    return misses, hits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default="mid", help="tiny, mid, or a checkpoint directory")
    parser.add_argument("--root", type=Path, default=Path(".cache/bench"), help="where bench checkpoints are built")
    parser.add_argument("--requests", type=int, default=160, help="requests per service phase (one image each)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--image-size", default="320x240", help="WxH of the generated images")
    parser.add_argument("--image-format", default="jpeg", choices=["jpeg", "png"])
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32")
    # Each batch size timed over this many images: the best of a few 2-second samples on a noisy
    # machine is the luckiest, not the fastest (the bare phase used twice the largest batch size).
    parser.add_argument("--bare-images", type=int, default=48, help="images per batch size in the bare phase")
    parser.add_argument("--phases", default="bare,service,nobatch,cache")
    parser.add_argument("--rounds", type=int, default=4, help="paired phase: bare and service rounds, in turns")
    parser.add_argument("--paired-batch", type=int, default=1, help="paired phase's bare batch, without a bare phase")
    parser.add_argument(
        "--loadgen-nice",
        type=int,
        default=0,
        help="paired phase: run the load generator at this niceness (a diagnostic: it shares the cores)",
    )
    parser.add_argument(
        "--image-processor-backend",
        default="auto",
        choices=["auto", "pil", "torchvision"],
        help="the bare pipeline's and the service's (auto: torchvision where it imports, as the service's default)",
    )
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    args = parser.parse_args()
    backend = args.image_processor_backend
    # The bare pipeline as `mmencode serve` runs its forwards: with glibc's malloc set the same way, the
    # service/bare ratio measures what serving adds, not the allocator setting (bench/README.md, "Allocator").
    keep_large_blocks_in_heap()

    checkpoint = build_checkpoint(args.checkpoint, args.root) if "/" not in args.checkpoint else Path(args.checkpoint)
    width, height = (int(v) for v in args.image_size.split("x"))
    images = encoded_images(args.requests, width, height, image_format=args.image_format)
    uris = [data_uri(image, f"image/{args.image_format}") for image in images]
    phases = set(args.phases.split(","))
    results: dict[str, Any] = {
        "checkpoint": str(checkpoint),
        "requests": args.requests,
        "concurrency": args.concurrency,
        "image_size": args.image_size,
        "image_format": args.image_format,
        "torch_threads": torch.get_num_threads(),
        "image_processor_backend": backend,
    }
    if "bare" in phases:
        sizes = [int(v) for v in args.batch_sizes.split(",")]
        bare_images = images[: max(max(sizes) * 2, args.bare_images)]
        results["bare"] = bare_pipeline(checkpoint, bare_images, sizes, torch.float32, backend)
        print("bare", json.dumps(results["bare"]), flush=True)
    if "service" in phases:
        results["service"] = service_load(checkpoint, uris, args.concurrency, "--image-processor-backend", backend)
        print("service", json.dumps(results["service"]), flush=True)
    if "overlap" in phases:
        # Preprocessing and the forward on the same cores at once: what the service did before the gate.
        results["service_overlap"] = service_load(checkpoint, uris, args.concurrency, "--no-exclusive-forward")
        print("overlap", json.dumps(results["service_overlap"]), flush=True)
    if "nobatch" in phases:
        results["service_no_batching"] = service_load(checkpoint, uris, args.concurrency, "--max-batch-items", "1")
        print("nobatch", json.dumps(results["service_no_batching"]), flush=True)
    if "cache" in phases:
        results["cache"] = cache_latency(checkpoint, images, min(20, len(images)), mime=f"image/{args.image_format}")
        print("cache", json.dumps(results["cache"]), flush=True)
    if "paired" in phases:
        batch = results["bare"]["best_batch"] if "bare" in results else args.paired_batch
        results["paired"] = paired_rounds(
            checkpoint, images, uris, args.concurrency, batch, args.rounds, args.loadgen_nice, backend
        )
        print("paired", json.dumps(results["paired"]), flush=True)
    if "bare" in results and "service" in results:
        results["service_over_bare"] = round(results["service"]["images_per_s"] / results["bare"]["images_per_s"], 3)
        print("service/bare", results["service_over_bare"])
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
