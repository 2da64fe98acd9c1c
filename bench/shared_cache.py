"""Shared-cache latency: a miss (encoder), a local hit (this replica's LRU) and a remote hit (Redis,
written by another replica), sequential, on two replicas sharing one redis-server on loopback.

    python -m bench.shared_cache --checkpoint mid --images 20

For each image: replica A encodes it (miss), A again with the image and by hash (local hits), then B,
which has never seen it (remote hit), by hash for even images and with the image for odd ones.
Also prints the stored value size per item, by storage dtype.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import httpx
import redis
import torch

from bench.checkpoints import build_checkpoint
from bench.client import data_uri
from bench.common import jpeg_images, percentile, redis_server, service
from mmencode.app.engine.cache import CachedEmbedding
from mmencode.app.engine.cache.shared import encode_value


def _post(client: httpx.Client, item: dict[str, str]) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    response = client.post("/v1/encode", json={"items": [item]})
    took = time.perf_counter() - started
    response.raise_for_status()
    return took, response.json()["items"][0]


def _wait_written(store: redis.Redis, content_hash: str) -> None:
    for _ in range(500):
        if store.keys(f"mmencode:*:{content_hash}"):
            return
        time.sleep(0.01)
    raise RuntimeError(f"{content_hash} was never written to Redis")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default="mid", choices=["tiny", "mid"])
    parser.add_argument("--root", type=Path, default=Path(".cache/bench"))
    parser.add_argument("--images", type=int, default=20)
    parser.add_argument("--width", type=int, default=320)
    parser.add_argument("--height", type=int, default=240)
    args = parser.parse_args()

    checkpoint = build_checkpoint(args.checkpoint, args.root)
    jpegs = jpeg_images(args.images + 2, args.width, args.height, seed=11)
    timings: dict[str, list[float]] = {
        name: [] for name in ("miss", "local_hit_image", "local_hit_hash", "remote_hit_image", "remote_hit_hash")
    }
    rows: torch.Tensor | None = None
    metadata: dict[str, Any] = {}
    with redis_server() as url:
        store = redis.Redis.from_url(url)
        options = ("--shared-cache", url, "--log-level", "warning")
        with (
            service(checkpoint, *options) as a,
            service(checkpoint, *options) as b,
            httpx.Client(base_url=a, timeout=120) as client_a,
            httpx.Client(base_url=b, timeout=120) as client_b,
        ):
            for warm in jpegs[:2]:  # first requests pay one-off costs
                _post(client_a, {"image": data_uri(warm)})
            for n, jpeg in enumerate(jpegs[2:]):
                by_image = {"image": data_uri(jpeg)}
                took, item = _post(client_a, by_image)
                assert item["source"] == "encoder"
                timings["miss"].append(took)
                by_hash = {"hash": item["hash"]}
                for name, request in (("local_hit_image", by_image), ("local_hit_hash", by_hash)):
                    took, again = _post(client_a, request)
                    assert again["source"] == "cache"
                    timings[name].append(took)
                _wait_written(store, item["hash"])
                name, request = ("remote_hit_hash", by_hash) if n % 2 == 0 else ("remote_hit_image", by_image)
                took, remote = _post(client_b, request)
                assert remote["source"] == "cache"
                timings[name].append(took)
                metadata = item["metadata"]
                rows = torch.zeros(item["embedding"]["shape"])

    assert rows is not None
    value = CachedEmbedding(rows, metadata)
    sizes = {
        str(dtype).removeprefix("torch."): len(encode_value(value, dtype)) for dtype in (torch.float32, torch.bfloat16)
    }
    miss_p50 = percentile(timings["miss"], 50)
    summary = {
        "checkpoint": args.checkpoint,
        "image": f"{args.width}x{args.height} JPEG, {sum(map(len, jpegs)) // len(jpegs)} bytes",
        "rows_per_item": list(rows.shape),
        "value_bytes": sizes,
        **{f"{name}_p50_ms": round(percentile(values, 50) * 1000, 2) for name, values in timings.items()},
        **{f"{name}_p90_ms": round(percentile(values, 90) * 1000, 2) for name, values in timings.items()},
        **{
            f"miss_over_{name}": round(miss_p50 / percentile(values, 50), 1)
            for name, values in timings.items()
            if name != "miss"
        },
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
