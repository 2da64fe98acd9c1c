"""bench/scaling.py's pure parts: the tables and the two-panel plot, from given results."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from bench import scaling
from bench.server_times import ServerTimes, gauge_value, histogram_totals
from mmencode.app.metrics import Metrics

RESULTS: dict[str, Any] = {
    "checkpoint_kind": "mid",
    "machine": "2 CPUs",
    "image_size": "320x240",
    "size_concurrency": 1,
    "concurrency": [
        {
            "concurrency": c,
            "requests": max(24, 2 * c),
            "images_per_s": ips,
            "p50_ms": p50,
            "p99_ms": p99,
            "images_per_forward": ipf,
            "encoder_busy": 0.9,
        }
        for c, ips, p50, p99, ipf in [(1, 8.1, 120, 140, 1.0), (4, 9.0, 430, 520, 2.6), (16, 9.3, 1700, 1900, 4.9)]
    ],
    "sizes": [
        {
            "image": image,
            "rows": rows,
            "requests": 16,
            "p50_ms": p50,
            "p99_ms": p50 * 1.2,
            "encoder_ms_per_forward": p50 * 0.8,
            "images_per_s": 1000 / p50,
        }
        for image, rows, p50 in [
            ("56x56", 4, 12.0),
            ("168x168", 36, 40.0),
            ("336x336", 144, 130.0),
            ("448x448", 144, 131.0),
        ]
    ],
}


def test_tables_list_every_point() -> None:
    text = scaling.format_tables(RESULTS)
    lines = text.splitlines()
    assert "| 4 | 24 | 9.00 | 430 | 520 | 2.60 | 90% |" in lines
    assert "| 336x336 | 144 | 16 | 130.0 | 156.0 | 104.0 | 7.69 |" in lines
    assert sum(line.startswith("| ") and line[2].isdigit() for line in lines) == 3 + 4


def test_plot_draws_two_panels(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "nested" / "scaling.png"
    scaling.plot(RESULTS, path)
    image = Image.open(path)
    assert image.format == "PNG"
    pixels = np.asarray(image.convert("RGB")).astype(int)
    half = pixels.shape[1] // 2

    def coloured(part: np.ndarray, rgb: tuple[int, int, int]) -> int:
        return int((np.abs(part - np.array(rgb)).sum(axis=-1) < 60).sum())

    # Throughput (tab:blue) only on the left; the encoder's time (tab:green) only on the right.
    assert coloured(pixels[:, :half], (31, 119, 180)) > 200 and coloured(pixels[:, half:], (31, 119, 180)) == 0
    assert coloured(pixels[:, half:], (44, 160, 44)) > 100 and coloured(pixels[:, :half], (44, 160, 44)) == 0


def test_server_times_are_exact_means_between_two_scrapes() -> None:
    def scrape(encoder: tuple[float, int], items: tuple[int, int], request: tuple[float, int]) -> str:
        return "\n".join([
            "# TYPE mmencode_encoder_seconds histogram",
            f'mmencode_encoder_seconds_bucket{{le="+Inf"}} {encoder[1]}',
            f"mmencode_encoder_seconds_count {encoder[1]}",
            f"mmencode_encoder_seconds_sum {encoder[0]}",
            "# TYPE mmencode_batch_items histogram",
            f'mmencode_batch_items_bucket{{le="+Inf"}} {items[1]}',
            f"mmencode_batch_items_count {items[1]}",
            f"mmencode_batch_items_sum {items[0]}",
            "# TYPE mmencode_request_duration_seconds histogram",
            f'mmencode_request_duration_seconds_count{{method="POST",route="/v1/encode",status="200"}} {request[1]}',
            f'mmencode_request_duration_seconds_sum{{method="POST",route="/v1/encode",status="200"}} {request[0]}',
            'mmencode_request_duration_seconds_count{method="GET",route="/metrics",status="200"} 50',
            'mmencode_request_duration_seconds_sum{method="GET",route="/metrics",status="200"} 9.0',
            "",
        ])  # fmt: skip

    before = scrape((1.0, 2), (3, 2), (2.0, 3))
    after = scrape((4.0, 8), (21, 8), (14.0, 21))
    assert histogram_totals(after, "mmencode_request_duration_seconds") == (23.0, 71.0)
    times = ServerTimes.between(before, after)
    assert times.forwards == 6 and times.encoder_s_total == 3.0 and times.encoder_s_per_forward == 0.5
    assert times.images_per_forward == 3.0 and times.request_s == 12.0 / 18
    assert np.isnan(times.queue_wait_s)  # no such histogram in these scrapes


def test_a_gauge_is_read_from_the_service_own_metrics() -> None:
    # The paired bench reports the forward threads the service chose at start (a start that chose one
    # thread for the mid tower halved its throughput); an older service without the gauge reads None.
    metrics = Metrics()
    metrics.cpu_forward_threads.set(2)
    text = metrics.render().decode()
    assert gauge_value(text, "mmencode_cpu_forward_threads") == 2.0
    assert gauge_value(text, "mmencode_no_such_gauge") is None
