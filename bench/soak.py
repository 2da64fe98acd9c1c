"""Overload soak: far more clients than the queue admits, good and hostile requests, clients that vanish.

    python -m bench.soak                       # about 10 minutes
    python -m bench.soak --duration 15 --short # what CI runs

Loopback only; bounded by ``--duration`` and ``--max-requests``. Reports requests sent, responses by
status, requests lost (connection errors) or hung (no answer within ``--hang-after``), the server's RSS
at start and end, whether the worker stayed up, and whether every good response's embedding equals
the reference computed before the load. Exits non-zero when any of those fails.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.checkpoints import build_checkpoint
from bench.client import data_uri, decode_rows
from bench.common import jpeg_images, service_process

BAD_BODIES: list[tuple[str, Any]] = [
    ("invalid_image", {"items": [{"image": base64.b64encode(b"<html>no</html>").decode()}]}),
    ("truncated_png", {"items": [{"image": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB"}]}),
    ("schema", {"items": [], "dtype": "int4"}),
    ("unknown_hash", {"items": [{"hash": "f" * 32}]}),
    ("partial", None),  # built once the reference is known
    ("not_json", b"{]"),
]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


async def soak(url: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    jpegs = jpeg_images(args.images, 256, 192, seed=5)
    references: list[np.ndarray] = []
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        for jpeg in jpegs:
            response = await client.post("/v1/encode", json={"items": [{"image": data_uri(jpeg)}]})
            references.append(decode_rows(response.json()["items"][0]["embedding"]))
        given = {"precomputed_embedding": {"data": base64.b64encode(references[0].tobytes()).decode(),
                                           "shape": list(references[0].shape)}}  # fmt: skip
        bad = dict(BAD_BODIES)
        bad["partial"] = {"items": [given, {"image": data_uri(jpegs[1])}]}

    rss_start = rss_kib(pid)
    statuses: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    problems: list[str] = []
    mismatched = 0
    sent = 0
    deadline = time.monotonic() + args.duration
    rng = random.Random(0)
    limits = httpx.Limits(max_connections=args.concurrency * 2)

    async with httpx.AsyncClient(base_url=url, timeout=args.hang_after, limits=limits) as client:

        async def one() -> None:
            nonlocal sent, mismatched
            roll = rng.random()
            sent += 1
            if roll < 0.15:  # a client that gives up mid-request
                kinds["disconnect"] += 1
                index = rng.randrange(len(jpegs))
                try:
                    await client.post("/v1/encode", json={"items": [{"image": data_uri(jpegs[index])}]},
                                      timeout=rng.uniform(0.001, 0.05))  # fmt: skip
                    statuses["disconnect-answered"] += 1
                except httpx.TimeoutException:
                    statuses["disconnect"] += 1
                except httpx.HTTPError:
                    statuses["disconnect-reset"] += 1  # the aborted exchange's connection was dropped
                return
            if roll < 0.45:
                name, body = rng.choice(list(bad.items()))
                kinds[f"bad:{name}"] += 1
                request = {"content": body} if isinstance(body, bytes) else {"json": body}
            else:
                kinds["good"] += 1
                index = rng.randrange(len(jpegs))
                count = rng.choice([1, 1, 2, 4])
                request = {
                    "json": {"items": [{"image": data_uri(jpegs[(index + k) % len(jpegs)])} for k in range(count)]}
                }
            try:
                response = await client.post("/v1/encode", **request)
            except httpx.TimeoutException:
                statuses["hung"] += 1
                problems.append("hung request")
                return
            except httpx.HTTPError as exc:
                statuses["lost"] += 1
                problems.append(f"lost: {exc!r}")
                return
            statuses[str(response.status_code)] += 1
            body_json = response.json()
            if response.status_code >= 500 and response.status_code != 503:
                problems.append(f"{response.status_code}: {response.text[:200]}")
            if response.status_code != 200 and set(body_json) != {"error"}:
                problems.append(f"not the error shape: {response.text[:200]}")
            if response.status_code == 200 and "json" in request and "items" in request["json"]:
                for k, item in enumerate(body_json["items"]):
                    want = references[(index + k) % len(jpegs)]
                    if not np.allclose(decode_rows(item["embedding"]), want, atol=1e-4, rtol=0):
                        mismatched += 1

        async def user() -> None:
            while time.monotonic() < deadline and sent < args.max_requests:
                await one()

        await asyncio.gather(*(user() for _ in range(args.concurrency)))
        ready = (await client.get("/ready")).status_code

    rss_end = rss_kib(pid)
    ok = not problems and mismatched == 0 and ready == 200 and statuses["200"] > 0
    return {
        "ok": ok,
        "duration_s": args.duration,
        "concurrency": args.concurrency,
        "max_queue": args.max_queue,
        "requests_sent": sent,
        "kinds": dict(kinds),
        "responses_by_status": dict(statuses),
        "lost": statuses["lost"],
        "hung": statuses["hung"],
        "good_embeddings_mismatched": mismatched,
        "ready_at_end": ready,
        "rss_start_mib": round(rss_start / 1024, 1),
        "rss_end_mib": round(rss_end / 1024, 1),
        "problems": problems[:10],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    parser.add_argument("--max-requests", type=int, default=1_000_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-queue", type=int, default=8)
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--hang-after", type=float, default=60.0, help="a request unanswered this long is hung")
    parser.add_argument("--short", action="store_true", help="CI mode: smaller pool of images")
    parser.add_argument("--root", type=Path, default=Path(".cache/bench"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.short:
        args.images = min(args.images, 6)
    checkpoint = build_checkpoint("tiny", args.root)
    # Cache off: every good request must go through the queue and the encoder.
    options = ["--max-queue", str(args.max_queue), "--cache-bytes", "0", "--log-level", "warning"]
    options += ["--request-timeout", "30"]
    with service_process(checkpoint, *options) as (url, process):
        report = asyncio.run(soak(url, process.pid, args))
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
