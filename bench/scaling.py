"""Scaling curves: throughput vs concurrency, and latency vs image size (rows per image).

    python -m bench.scaling --out scaling.json   # mid checkpoint: ~1.5-3 minutes on 2 cores; writes bench/scaling.png
    python -m bench.scaling --quick              # fewer levels, sizes and requests: about a minute

One ``mmencode serve`` subprocess (cache off, so every request runs the encoder) on the mid-size
Qwen2-VL tower (``bench.checkpoints``, images up to 336x336 = 144 rows):

- **concurrency**: one ``--image-size`` JPEG per request (320x240: 99 rows, as ``bench.bench``), at each
  ``--concurrency`` level, ``max(--requests, 2 x level)`` requests: images/s, p50, p99, and from /metrics
  the images per encoder forward and the encoder's busy share (what batching does as load grows).
- **size**: square JPEGs from 56x56 to past the processor's 336x336 cap, ``--size-requests`` each at
  ``--size-concurrency`` (default 1: sequential, so latency is cost, not queueing). Rows per image are
  the response's ``num_tokens`` (grid_h * grid_w / 4); the encoder's own time per forward comes from /metrics.

Both tables are printed; ``--out`` writes them as JSON; ``--png`` (default bench/scaling.png, next to
bench/README.md) plots the two panels with matplotlib's Agg backend (``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.checkpoints import build_checkpoint
from bench.client import data_uri
from bench.common import drive, jpeg_images, service
from bench.server_times import ServerTimes

DEFAULT_PNG = Path(__file__).with_name("scaling.png")
_FULL: dict[str, Any] = {"concurrency": "1,2,4,8,16,32,64", "requests": 24, "sizes": "56,112,168,224,280,336,448"}
_FULL["size_requests"] = 16
_QUICK: dict[str, Any] = {"concurrency": "1,4,16,64", "requests": 12, "sizes": "56,168,336,448", "size_requests": 8}
_SERVE_FLAGS = ("--cache-bytes", "0", "--max-queue", "100000", "--request-timeout", "600", "--log-level", "warning")


def _bodies(jpegs: Sequence[bytes]) -> list[dict[str, Any]]:
    return [{"items": [{"image": data_uri(jpeg)}]} for jpeg in jpegs]


def _measure(url: str, bodies: list[dict[str, Any]], concurrency: int) -> dict[str, Any]:
    before = httpx.get(url + "/metrics").text
    result = asyncio.run(drive(url, "/v1/encode", bodies, concurrency))
    after = httpx.get(url + "/metrics").text
    times = ServerTimes.between(before, after)
    summary = result.summary()
    return {
        "requests": len(bodies),
        "images_per_s": summary["images_per_s"],
        "p50_ms": summary["p50_ms"],
        "p99_ms": summary["p99_ms"],
        "statuses": summary["statuses"],
        "images_per_forward": round(times.images_per_forward, 2),
        "encoder_ms_per_forward": round(times.encoder_s_per_forward * 1000, 1),
        "encoder_busy": round(times.encoder_s_total / result.seconds, 3),
    }


def concurrency_curve(url: str, jpegs: Sequence[bytes], levels: Sequence[int], requests: int) -> list[dict[str, Any]]:
    bodies = _bodies(jpegs)
    points = []
    for level in levels:
        count = max(requests, 2 * level)
        point = {"concurrency": level, **_measure(url, [bodies[i % len(bodies)] for i in range(count)], level)}
        print("concurrency", json.dumps(point), flush=True)
        points.append(point)
    return points


def size_curve(
    url: str, sizes: Sequence[tuple[int, int]], requests: int, concurrency: int, seed: int = 100
) -> list[dict[str, Any]]:
    points = []
    for index, (width, height) in enumerate(sizes):
        bodies = _bodies(jpeg_images(requests + 1, width, height, seed=seed + index))
        # The first image is the probe: rows per image as the service counts them, and a warm-up.
        probe = httpx.post(url + "/v1/encode", json=bodies[0], timeout=600)
        probe.raise_for_status()
        rows = probe.json()["items"][0]["num_tokens"]
        point = {"image": f"{width}x{height}", "rows": rows, **_measure(url, bodies[1:], concurrency)}
        print("size", json.dumps(point), flush=True)
        points.append(point)
    return points


def format_tables(results: dict[str, Any]) -> str:
    lines = []
    if results.get("concurrency"):
        lines += [
            f"Throughput vs concurrency ({results['image_size']} JPEGs, one per request)",
            "| concurrency | requests | images/s | p50 ms | p99 ms | images/forward | encoder busy |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        lines += [
            f"| {p['concurrency']} | {p['requests']} | {p['images_per_s']:.2f} | {p['p50_ms']:.0f} | "
            f"{p['p99_ms']:.0f} | {p['images_per_forward']:.2f} | {p['encoder_busy']:.0%} |"
            for p in results["concurrency"]
        ]
    if results.get("sizes"):
        lines += [""] if lines else []
        lines += [
            f"Latency vs image size (concurrency {results['size_concurrency']})",
            "| image | rows | requests | p50 ms | p99 ms | encoder ms/forward | images/s |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        lines += [
            f"| {p['image']} | {p['rows']} | {p['requests']} | {p['p50_ms']:.1f} | {p['p99_ms']:.1f} | "
            f"{p['encoder_ms_per_forward']:.1f} | {p['images_per_s']:.2f} |"
            for p in results["sizes"]
        ]
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> None:
    """Two panels: images/s (and latency) vs concurrency; latency vs rows per image. Agg: no display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), layout="constrained")
    points = results.get("concurrency") or []
    if points:
        levels = [p["concurrency"] for p in points]
        left.plot(levels, [p["images_per_s"] for p in points], "o-", color="tab:blue", label="images/s")
        left.set_xscale("log", base=2)
        left.set_xticks(levels, [str(level) for level in levels])
        left.set_xlabel("concurrent requests")
        left.set_ylabel("images/s", color="tab:blue")
        left.set_ylim(bottom=0)
        latency = left.twinx()
        latency.plot(levels, [p["p50_ms"] for p in points], "s--", color="tab:orange", label="p50")
        latency.plot(levels, [p["p99_ms"] for p in points], "^--", color="tab:red", label="p99")
        latency.set_ylabel("latency (ms)")
        latency.set_ylim(bottom=0)
        handles = left.get_legend_handles_labels()[0] + latency.get_legend_handles_labels()[0]
        left.legend(handles, [str(h.get_label()) for h in handles], loc="upper left")
    left.set_title(f"Throughput vs concurrency ({results.get('image_size', '')} JPEGs)")

    points = sorted(results.get("sizes") or [], key=lambda p: p["rows"])
    if points:
        rows = [p["rows"] for p in points]
        right.plot(rows, [p["p50_ms"] for p in points], "s-", color="tab:orange", label="p50 (request)")
        right.plot(rows, [p["p99_ms"] for p in points], "^-", color="tab:red", label="p99 (request)")
        right.plot(
            rows, [p["encoder_ms_per_forward"] for p in points], "o:", color="tab:green", label="encoder forward (mean)"
        )
        # One label per row count: sizes past the processor's pixel cap land on the same rows.
        labels: dict[int, tuple[list[str], float]] = {}
        for point in points:
            labels.setdefault(point["rows"], ([], point["p50_ms"]))[0].append(point["image"])
        for count, (images, p50) in labels.items():
            last = count == rows[-1]
            right.annotate(", ".join(images), (count, p50), textcoords="offset points",
                           xytext=(-8 if last else 8, -14), fontsize=7, ha="right" if last else "left")  # fmt: skip
        right.set_xlabel("rows per image (grid_h x grid_w / 4)")
        right.set_ylabel("latency (ms)")
        right.set_ylim(bottom=0)
        right.legend(loc="upper left")
    right.set_title(f"Latency vs image size (concurrency {results.get('size_concurrency', 1)})")
    fig.suptitle(f"mmencode on {results.get('checkpoint_kind', 'checkpoint')}, {results.get('machine', '')}".strip())
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _sizes(text: str) -> list[tuple[int, int]]:
    out = []
    for size in text.split(","):
        width, _, height = size.partition("x")
        out.append((int(width), int(height or width)))
    return out


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default="mid", help="tiny, mid, or a checkpoint directory")
    parser.add_argument("--root", type=Path, default=Path(".cache/bench"), help="where bench checkpoints are built")
    parser.add_argument("--concurrency", help="levels of the first curve (default 1,2,4,8,16,32,64)")
    parser.add_argument("--requests", type=int, help="requests per level, at least 2 x the level (default 24)")
    parser.add_argument("--image-size", default="320x240", help="WxH of the concurrency curve's JPEGs")
    parser.add_argument(
        "--sizes", help="images of the second curve: W or WxH, comma-separated (default 56,112,168,224,280,336,448)"
    )
    parser.add_argument("--size-requests", type=int, help="requests per image size (default 16)")
    parser.add_argument("--size-concurrency", type=int, default=1)
    parser.add_argument(
        "--quick", action="store_true", help="defaults for a short run: levels 1,4,16,64, four sizes, 8-12 requests"
    )
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    parser.add_argument("--png", type=Path, default=DEFAULT_PNG, help="the plot (default: bench/scaling.png)")
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args(argv)
    # Flags given explicitly win over either set of defaults.
    defaults = _QUICK if args.quick else _FULL
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)

    started = time.perf_counter()
    is_dir = "/" in args.checkpoint or Path(args.checkpoint).is_dir()
    checkpoint = Path(args.checkpoint) if is_dir else build_checkpoint(args.checkpoint, args.root)
    levels = [int(v) for v in args.concurrency.split(",") if v]
    width, height = _sizes(args.image_size)[0]
    jpegs = jpeg_images(max([args.requests, *(2 * level for level in levels)]), width, height)
    results: dict[str, Any] = {
        "checkpoint": str(checkpoint),
        "checkpoint_kind": checkpoint.name,
        "machine": f"{os.cpu_count()} CPUs",
        "image_size": f"{width}x{height}",
        "size_concurrency": args.size_concurrency,
    }
    with service(checkpoint, *_SERVE_FLAGS) as url:
        asyncio.run(drive(url, "/v1/encode", _bodies(jpegs[:4]), 2))  # warm-up
        results["concurrency"] = concurrency_curve(url, jpegs, levels, args.requests)
        results["sizes"] = size_curve(url, _sizes(args.sizes), args.size_requests, args.size_concurrency)
    results["seconds"] = round(time.perf_counter() - started, 1)
    print(format_tables(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    if not args.no_plot:
        try:
            plot(results, args.png)
            print(f"plot: {args.png}")
        except ModuleNotFoundError as error:  # the tables and JSON stand without it
            print(f"no plot: {error.name} is not installed (pip install -e '.[bench]')")
    return results


if __name__ == "__main__":
    main()
