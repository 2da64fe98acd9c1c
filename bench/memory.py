"""The service's memory under steady traffic: RSS beside the cache and memo gauges, sampled over a run.

    python -m bench.memory --traffic mixed --duration 600 --plot bench/memory.png   # bench/README.md, "Memory"
    python -m bench.memory --traffic fresh --requests 3000 --cache-bytes 8MiB --response-memo-bytes 8MiB

One ``mmencode serve`` subprocess on the tiny default checkpoint (the process as operators run it, its
allocator settings included), driven on loopback by ``--concurrency`` clients:

- ``fresh``: every request one image never sent before (PNG noise, 56-224 px a side, as a data URI);
- ``mixed``: fresh images (45 %), repeats of earlier ones (15 %), ``{"hash": ...}`` reuse (10 %),
  hostile inputs (15 %) and clients that hang up mid-request (15 %);
- ``video``: every request a short clip never sent before (mp4, 8 frames), so decoded frames wait for
  the encoder beside each other;
- ``repeats``, ``hostile``, ``hang-ups``: one of the mixed traffic's kinds alone (cache hits of 64 images;
  bad inputs; clients that give up mid-request).

The first ``--warmup`` requests (fresh images) fill the process's working set; RSS then is the baseline.
Every ``--sample-every`` seconds: requests answered, RSS, and the gauges. The report says where RSS ended
against the baseline plus the two budgets, and its slope over the run's second half; ``--plot`` draws it.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import random
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from PIL import Image

from bench.checkpoints import build_checkpoint
from bench.common import service_process

GAUGES = (
    "mmencode_cache_bytes",
    "mmencode_response_memo_bytes",
    "mmencode_queue_bytes",
    "mmencode_shared_cache_pending_bytes",
)
HOSTILE: list[Any] = [
    {"items": [{"image": base64.b64encode(b"<html>no</html>").decode()}]},
    {"items": [{"image": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB"}]},
    {"items": [], "dtype": "int4"},
    {"items": [{"hash": "f" * 32}]},
    b"{]",
]
_MIB = 1 << 20


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def gauges(metrics_text: str) -> dict[str, float]:
    found = {}
    for name in GAUGES:
        match = re.search(rf"^{name} (\S+)$", metrics_text, re.M)
        found[name] = float(match.group(1)) if match else 0.0
    return found


class Traffic:
    """Request bodies of one kind of traffic, each drawn as it is sent."""

    def __init__(self, kind: str, seed: int) -> None:
        self.kind = kind
        self.rng = random.Random(seed)
        self.pixels = np.random.default_rng(seed)
        self.sent: list[str] = []  # data URIs already sent (repeats)
        self.hashes: list[str] = []  # hashes the service answered (reuse)

    def fresh_image(self) -> str:
        width, height = (int(side) for side in self.pixels.integers(56, 225, 2))
        buffer = io.BytesIO()
        Image.fromarray(self.pixels.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buffer, "PNG")
        uri = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
        self.sent = [*self.sent[-63:], uri]
        return uri

    def fresh_video(self) -> str:
        from bench.media import clip, video_data_uri  # PyAV: only for this kind

        seed = int(self.pixels.integers(1 << 30))
        return video_data_uri(clip(8, 64, 48, fps=4, seed=seed))

    def next(self) -> tuple[str, Any]:
        """``(what it is, body)``: a dict for JSON, bytes sent as they are."""
        if self.kind == "fresh":
            return "fresh", {"items": [{"image": self.fresh_image()}]}
        if self.kind == "video":
            return "video", {"items": [{"video": self.fresh_video(), "fps": 2}]}
        if self.kind == "repeats":
            if len(self.sent) < 64:
                return "fresh", {"items": [{"image": self.fresh_image()}]}
            return "repeat", {"items": [{"image": self.rng.choice(self.sent)}]}
        if self.kind == "hostile":
            return "hostile", self.rng.choice(HOSTILE)
        if self.kind == "hang-ups":
            return "hang-up", {"items": [{"image": self.fresh_image()}]}
        roll = self.rng.random()
        if roll < 0.15 and self.sent:
            return "repeat", {"items": [{"image": self.rng.choice(self.sent)}]}
        if roll < 0.25 and self.hashes:
            return "hash", {"items": [{"hash": self.rng.choice(self.hashes[-256:])}]}
        if roll < 0.40:
            return "hostile", self.rng.choice(HOSTILE)
        if roll < 0.55:
            return "hang-up", {"items": [{"image": self.fresh_image()}]}
        return "fresh", {"items": [{"image": self.fresh_image()}]}


async def run(url: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    traffic = Traffic(args.traffic, seed=7)
    statuses: Counter[str] = Counter()
    answered = 0
    samples: list[dict[str, float]] = []
    connector = aiohttp.TCPConnector(limit=args.concurrency * 2)
    async with aiohttp.ClientSession(base_url=url, connector=connector) as session:

        async def scrape() -> dict[str, float]:
            async with session.get("/metrics") as response:
                return gauges(await response.text())

        async def one(kind: str, body: Any) -> None:
            nonlocal answered
            request: dict[str, Any] = {"data": body} if isinstance(body, bytes) else {"json": body}
            timeout = aiohttp.ClientTimeout(total=random.uniform(0.002, 0.03) if kind == "hang-up" else 120)
            try:
                async with session.post("/v1/encode", timeout=timeout, **request) as response:
                    answer = await response.read()
            except (TimeoutError, aiohttp.ClientError):
                statuses["hung up" if kind == "hang-up" else "lost"] += 1
                return
            statuses[str(response.status)] += 1
            answered += 1
            if response.status == 200 and kind in {"fresh", "repeat"}:
                traffic.hashes.append(json.loads(answer)["items"][0]["hash"])

        async def clients(requests: int, until: float) -> None:
            count = 0

            async def client() -> None:
                nonlocal count
                while count < requests and time.monotonic() < until:
                    count += 1
                    await one(*traffic.next())

            await asyncio.gather(*(client() for _ in range(args.concurrency)))

        warmup = Traffic("fresh" if args.traffic != "video" else "video", seed=1)
        saved, traffic = traffic, warmup
        await clients(args.warmup, time.monotonic() + 600)
        traffic = saved
        baseline = rss_bytes(pid)
        started = time.monotonic()
        deadline = started + args.duration

        async def sampler() -> None:
            while True:
                samples.append(
                    {"t": round(time.monotonic() - started, 1), "answered": answered, "rss": rss_bytes(pid)}
                    | await scrape()
                )
                await asyncio.sleep(args.sample_every)

        sampling = asyncio.create_task(sampler())
        await clients(args.requests, deadline)
        sampling.cancel()
        end = {"t": round(time.monotonic() - started, 1), "answered": answered, "rss": rss_bytes(pid)} | await scrape()
        samples.append(end)
    budgets = args.cache_bytes + args.response_memo_bytes
    half = [s for s in samples if s["t"] >= end["t"] / 2]
    slope = np.polyfit([s["t"] for s in half], [s["rss"] for s in half], 1)[0] if len(half) > 2 else 0.0
    return {
        "traffic": args.traffic,
        "concurrency": args.concurrency,
        "seconds": end["t"],
        "requests": answered,
        "responses": dict(statuses),
        "budgets_bytes": budgets,
        "baseline_rss_bytes": baseline,
        "end_rss_bytes": end["rss"],
        "peak_rss_bytes": max(s["rss"] for s in samples),
        "growth_bytes": end["rss"] - baseline,
        "slope_mib_per_min_second_half": round(slope * 60 / _MIB, 2),
        "gauges_at_end": {name: end[name] for name in GAUGES},
        "samples": samples,
    }


def plot(reports: list[tuple[str, dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 4.5))
    for label, report in reports:
        t = [s["t"] / 60 for s in report["samples"]]
        (line,) = axis.plot(t, [s["rss"] / _MIB for s in report["samples"]], label=f"{label}: RSS")
        held = [(s["mmencode_cache_bytes"] + s["mmencode_response_memo_bytes"]) / _MIB for s in report["samples"]]
        axis.plot(t, held, linestyle=":", color=line.get_color(), label=f"{label}: cache + memo gauges")
        ceiling = (report["baseline_rss_bytes"] + report["budgets_bytes"]) / _MIB
        axis.axhline(ceiling, linestyle="--", color=line.get_color(), linewidth=0.8)
    axis.set_xlabel("minutes of traffic")
    axis.set_ylabel("MiB")
    axis.set_title("mmencode serve under mixed traffic (dashed: baseline + cache and memo budgets)")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def _labelled(text: str) -> tuple[str, dict[str, Any]]:
    """``LABEL=REPORT.json`` as (label, report)."""
    label, path = text.split("=", 1)
    return label, json.loads(Path(path).read_text())


def _size(text: str) -> int:
    from pydantic import ByteSize, TypeAdapter

    return int(TypeAdapter(ByteSize).validate_python(text))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--traffic", choices=["fresh", "mixed", "video", "repeats", "hostile", "hang-ups"], default="mixed"
    )
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of traffic after the warm-up")
    parser.add_argument("--requests", type=int, default=10**9, help="stop after this many requests")
    parser.add_argument("--warmup", type=int, default=300, help="fresh requests before the baseline is read")
    parser.add_argument("--concurrency", type=int, default=6)
    parser.add_argument("--sample-every", type=float, default=5.0)
    parser.add_argument("--cache-bytes", type=_size, default=_size("512MiB"))
    parser.add_argument("--response-memo-bytes", type=_size, default=_size("256MiB"))
    parser.add_argument("--serve-option", action="append", default=[], help="another `mmencode serve` flag")
    parser.add_argument("--root", type=Path, default=Path(".cache/bench"))
    parser.add_argument("--out", type=Path, help="the report as JSON")
    parser.add_argument("--plot", type=Path, help="draw RSS and the gauges (with --compare, beside another run)")
    parser.add_argument("--compare", action="append", default=[], help="LABEL=REPORT.json to plot too")
    parser.add_argument("--label", default="this run")
    parser.add_argument("--plot-only", action="store_true", help="draw --compare's reports, run nothing")
    args = parser.parse_args(argv)
    if args.plot_only:
        plot([_labelled(text) for text in args.compare], args.plot)
        return 0
    checkpoint = build_checkpoint("tiny", args.root)
    options = ["--cache-bytes", str(args.cache_bytes), "--response-memo-bytes", str(args.response_memo_bytes)]
    options += ["--log-level", "warning", *args.serve_option]
    with service_process(checkpoint, *options) as (url, process):
        report = asyncio.run(run(url, process.pid, args))
    summary = {key: value for key, value in report.items() if key != "samples"}
    print(json.dumps(summary, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report))
    if args.plot:
        others = [
            (str(c).split("=", 1)[0], json.loads(Path(str(c).split("=", 1)[1]).read_text())) for c in args.compare
        ]
        plot([*others, (args.label, report)], args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
