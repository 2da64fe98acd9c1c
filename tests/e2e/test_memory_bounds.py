"""The process's memory levels off under steady traffic: a real ``mmencode serve`` with small budgets, thousands
of fresh items, RSS read from /proc (bench/memory.py drives it; bench/README.md, "Memory", has the long runs).

On the code before the fix this failed: with 8 MiB budgets, the memo's payloads held 6-12x what its gauge
counted, and RSS grew 84-88 MiB over the baseline where the budgets allow 16.
"""

from __future__ import annotations

import json
from pathlib import Path

import redis

from bench import memory
from tests.helpers import RedisServer, require_binary

BUDGET = 8 << 20  # each of the cache and the response memo
# What RSS may add beyond the budgets once warm: glibc's heaps keep what churn between entries of random
# sizes fragments, and the encoder's working set still grows a little past the warm-up (12-14 MiB with
# both budgets at 0 in the same run, 25 MiB with both at 8 MiB).
SLACK = 32 << 20


def _run(tmp_path: Path, traffic: str, requests: int, warmup: int, *serve: str) -> dict[str, object]:
    out = tmp_path / f"{traffic}.json"
    options = ["--traffic", traffic, "--requests", str(requests), "--warmup", str(warmup), "--concurrency", "4"]
    options += ["--cache-bytes", str(BUDGET), "--response-memo-bytes", str(BUDGET), "--duration", "240"]
    options += [f"--serve-option={option}" for option in serve]
    assert memory.main([*options, "--root", str(tmp_path / "bench"), "--out", str(out)]) == 0
    return dict(json.loads(out.read_text()))


def _check(report: dict[str, object]) -> None:
    responses = report["responses"]
    assert isinstance(responses, dict) and set(responses) == {"200"}, responses
    gauges = report["gauges_at_end"]
    assert isinstance(gauges, dict)
    # The gauges stay within their budgets...
    assert 0 < gauges["mmencode_cache_bytes"] <= BUDGET
    assert 0 < gauges["mmencode_response_memo_bytes"] <= BUDGET
    assert gauges["mmencode_queue_bytes"] == 0  # nothing waits once the traffic is answered
    # ... and the process holds no more than they say, plus the slack.
    growth = report["growth_bytes"]
    assert isinstance(growth, int) and growth <= 2 * BUDGET + SLACK, f"RSS grew {growth / 2**20:.0f} MiB"


def test_rss_levels_off_within_the_budgets_under_fresh_images(tmp_path: Path) -> None:
    # 8 MiB of the memo is ~1,000 answers of the tiny tower (8.4 KB of base64 each): 3,000 fill both budgets
    # three times over.
    _check(_run(tmp_path, "fresh", requests=3000, warmup=500))


def test_rss_levels_off_under_fresh_videos(tmp_path: Path) -> None:
    """Decoded frames wait for the encoder beside each other (``mmencode_queue_bytes``): nothing stays."""
    _check(_run(tmp_path, "video", requests=600, warmup=100))


def test_rss_levels_off_while_writing_connector_files(tmp_path: Path) -> None:
    """vLLM's encoder-cache files are written before each answer: nothing of them stays in the process."""
    storage = tmp_path / "ec"
    _check(_run(tmp_path, "fresh", 1500, 300, f"--ec-shared-storage={storage}"))
    # One file per item (within the default --ec-storage-bytes, nothing evicted), beside the budget's lock
    # and usage files.
    assert len(list(storage.glob("*/encoder_cache.safetensors"))) == 1800


def test_rss_levels_off_beside_a_shared_store_that_stalls_writes(tmp_path: Path) -> None:
    """A shared store that answers reads but holds every write (Redis's ``CLIENT PAUSE ... WRITE``): the
    background writes wait on it within their byte budget, and the rest are skipped."""
    with RedisServer(require_binary("redis-server", "redis-server")).running() as redis_server:
        client = redis.Redis.from_url(redis_server.url)
        client.execute_command("CLIENT", "PAUSE", 600_000, "WRITE")
        try:
            options = [f"--shared-cache={redis_server.url}", "--shared-cache-timeout=30"]
            options += [f"--shared-cache-pending-bytes={BUDGET}"]
            report = _run(tmp_path, "fresh", 1500, 300, *options)
        finally:
            client.execute_command("CLIENT", "UNPAUSE")
    _check(report)
    assert 0 < report["gauges_at_end"]["mmencode_shared_cache_pending_bytes"] <= BUDGET
