"""Two servers driven in turns with the same fresh images: what ``bench.vs_sglang`` and ``bench.vs_vllm_encoder``
share.

A *side* is one server and the client of its own protocol: :meth:`Side.send` posts one image and returns when
the side's work for it is done (the rows pushed, the file written), with the time that took. Per round every
side takes the same set of images, never sent to it before, in turns (the order rotated each round), so this
VM's drift from one minute to the next hits both alike; an idle server costs next to nothing meanwhile. Each
side's CPU is its whole process tree's, from /proc, over its own turns only.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from bench.common import percentile
from bench.proctree import tree_cpu_seconds

__all__ = [
    "Side", "Tally", "cached_jpegs", "drive_round", "image_set", "interleaved", "progress", "ratio_cell", "run_meta",
    "sizes_of", "write_results",
]  # fmt: skip

ROOT = Path(__file__).resolve().parents[1]


class Side(Protocol):
    name: str
    pid: int  # the root of the server's process tree

    async def send(self, index: int, image: str) -> float:
        """Post ``image`` (the round's ``index``-th); seconds until its result arrived. Raises on failure."""
        ...


@dataclass
class Tally:
    """One side's rounds at one setting."""

    images: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    rounds: list[float] = field(default_factory=list)  # images/s of each round
    client_cpu_seconds: float = 0.0  # the load generator's own CPU over this side's turns (same two cores)

    def add(
        self, images: int, seconds: float, cpu_seconds: float, latencies: list[float], errors: list[str],
        client_cpu_seconds: float = 0.0,
    ) -> None:  # fmt: skip
        self.images += images
        self.seconds += seconds
        self.cpu_seconds += cpu_seconds
        self.client_cpu_seconds += client_cpu_seconds
        self.latencies += latencies
        self.errors += errors
        self.rounds.append(images / seconds if seconds else 0.0)

    def summary(self) -> dict[str, Any]:
        ok = self.latencies or [float("nan")]
        return {
            "images": self.images,
            "images_per_s": round(self.images / self.seconds, 2) if self.seconds else 0.0,
            "p50_ms": round(percentile(ok, 50) * 1000, 1),
            "p99_ms": round(percentile(ok, 99) * 1000, 1),
            "mean_ms": round(statistics.fmean(ok) * 1000, 1),
            "cpu_s_per_image": round(self.cpu_seconds / self.images, 4) if self.images else None,
            "client_cpu_s_per_image": round(self.client_cpu_seconds / self.images, 4) if self.images else None,
            "rounds_images_per_s": [round(r, 2) for r in self.rounds],
            "errors": len(self.errors),
            "first_errors": self.errors[:3],
        }


async def drive_round(
    side: Side, images: Sequence[str], concurrency: int
) -> tuple[int, float, float, list[float], list[str], float]:
    """Every image once through ``side``, ``concurrency`` at a time: (done, seconds, the server's CPU seconds,
    latencies, errors, the load generator's own CPU seconds)."""
    latencies: list[float] = []
    errors: list[str] = []
    pending = iter(enumerate(images))

    async def user() -> None:
        for index, image in pending:
            try:
                latencies.append(await side.send(index, image))
            except Exception as exc:  # counted and shown: a failed request is not a fast one
                errors.append(f"{type(exc).__name__}: {exc}"[:300])

    cpu_before = tree_cpu_seconds(side.pid)
    client_before = time.process_time()
    started = time.perf_counter()
    await asyncio.gather(*(user() for _ in range(concurrency)))
    seconds = time.perf_counter() - started
    client_cpu = time.process_time() - client_before
    cpu = tree_cpu_seconds(side.pid) - cpu_before
    return len(latencies), seconds, cpu, latencies, errors, client_cpu


async def interleaved(
    sides: Sequence[Side],
    rounds: Sequence[Sequence[str]],
    concurrency: int,
    on_round: Callable[[int, dict[str, float]], None] | None = None,
) -> dict[str, Tally]:
    """One round per image set; in round r every side takes ``rounds[r]`` in turn, the order rotated."""
    tallies = {side.name: Tally() for side in sides}
    for r, images in enumerate(rounds):
        shift = r % len(sides)
        for side in [*sides[shift:], *sides[:shift]]:
            tallies[side.name].add(*await drive_round(side, images, concurrency))
        if on_round is not None:
            on_round(r, {name: tally.rounds[-1] for name, tally in tallies.items()})
    return tallies


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def load_average() -> list[float]:
    return [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]


def run_meta() -> dict[str, Any]:
    """What a reader needs to rerun a table and judge it: commit, command, date, machine and its load."""
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "commit": _git("rev-parse", "--short", "HEAD") + ("+uncommitted" if dirty else ""),
        "command": " ".join(["python -m", _module_name(), *sys.argv[1:]]),
        "started_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
        "load_average_at_start": load_average(),
    }


def _module_name() -> str:
    main = sys.modules["__main__"]
    spec = getattr(main, "__spec__", None)
    return spec.name if spec is not None else Path(sys.argv[0]).stem


def write_results(name: str, results: dict[str, Any], out: Path | None) -> Path:
    """``results`` (with the load at the end added) as JSON: ``out``, else bench/results/NAME-<time>.json."""
    results["meta"]["load_average_at_end"] = load_average()
    if out is None:
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
        out = ROOT / "bench" / "results" / f"{name}-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    return out


def cached_jpegs(root: Path, count: int, width: int, height: int, seed: int) -> list[bytes]:
    """``jpeg_images(count, width, height, seed)``, kept under ``root`` after the first time: a 1280x720 one
    takes ~0.1-0.2 s to draw here, and a run needs hundreds (the same files in every run of a command)."""
    from bench.common import jpeg_images

    folder = root / f"jpeg-{width}x{height}-{seed}"
    paths = [folder / f"{i:05d}.jpg" for i in range(count)]
    if not all(path.is_file() for path in paths):
        folder.mkdir(parents=True, exist_ok=True)
        for path, data in zip(paths, jpeg_images(count, width, height, seed=seed), strict=True):
            path.write_bytes(data)
    return [path.read_bytes() for path in paths]


def image_set(root: Path, size: tuple[int, int], count: int, seed: int) -> list[str]:
    """``count`` JPEG data URIs of ``size``, the same for a seed in every run (:func:`cached_jpegs`)."""
    from bench.client import data_uri

    return [data_uri(jpeg) for jpeg in cached_jpegs(root, count, *size, seed=seed)]


def sizes_of(text: str) -> list[tuple[int, int]]:
    """``"448x448,1280x720"`` -> ``[(448, 448), (1280, 720)]``."""
    return [(int(w), int(h)) for w, h in (size.split("x") for size in text.split(","))]


def ratio_cell(ours: dict[str, Any], theirs: dict[str, Any]) -> str:
    """``**ratio** (per round, ...)`` of two summaries' images/s."""
    rounds = [
        f"{a / b:.2f}" for a, b in zip(ours["rounds_images_per_s"], theirs["rounds_images_per_s"], strict=True) if b
    ]
    return f"**{ours['images_per_s'] / theirs['images_per_s']:.2f}** ({', '.join(rounds)})"


def progress(label: str, concurrency: int) -> Callable[[int, dict[str, float]], None]:
    """Prints each round's images/s per side, as :func:`interleaved` finishes it."""

    def show(r: int, rates: dict[str, float]) -> None:
        print(f"    {label} c={concurrency} round {r + 1}:", {k: round(v, 1) for k, v in rates.items()}, flush=True)

    return show


def add_matrix_arguments(parser: argparse.ArgumentParser, *, name: str) -> None:
    """The matrix both head-to-head scripts take: sizes, concurrencies, requests, rounds, where they keep
    their files, and the JSON (default ``bench/results/<name>-<time>.json``)."""
    parser.add_argument("--sizes", default="448x448,1280x720", help="WxH of the JPEGs, comma-separated")
    parser.add_argument("--concurrency", default="1,8,32", help="comma-separated")
    parser.add_argument("--requests", type=int, default=96, help="images per round and side")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--root", type=Path, default=Path(".cache/bench"), help="checkpoints and images")
    parser.add_argument("--out", type=Path, help=f"the JSON (default: bench/results/{name}-<time>.json)")
