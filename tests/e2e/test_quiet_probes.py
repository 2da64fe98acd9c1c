"""A start under a startup probe logs each phase once, not one line per probe."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx

from tests.helpers import free_port


def test_a_start_under_probing_logs_one_line_per_phase(checkpoints: dict[str, Path]) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "mmencode", "serve", "--model", str(checkpoints["qwen2_vl"]), "--port", str(port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    answers: Counter[int] = Counter()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                status = httpx.get(url + "/ready", timeout=5).status_code
            except httpx.TransportError:
                time.sleep(0.01)
                continue
            answers[status] += 1
            httpx.get(url + "/health", timeout=5)
            if status == 200:
                break
            time.sleep(0.01)
        for _ in range(20):  # a ready pod keeps being probed, and scraped
            assert httpx.get(url + "/ready", timeout=5).status_code == 200
            assert httpx.get(url + "/metrics", timeout=5).status_code == 200
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    log = output.decode()
    assert answers[200] == 1, answers
    assert answers[503] >= 3, f"the probe never saw the model loading: {answers}"
    mine = [line for line in log.splitlines() if " mmencode." in line]
    assert not [line for line in mine if re.search(r"GET /(ready|health|metrics) \d{3}", line)], log
    assert "WARNING" not in log and "not_ready" not in log, log
    # One line as loading starts, one once ready: the phases, not the probes.
    assert sum("loading the model" in line for line in mine) == 1, log
    assert sum("ready: serving" in line for line in mine) == 1, log
    # The rest are load-time facts (weights, preprocessing path, threads), once each, whatever the probing.
    assert len(mine) <= 6, log


def test_the_front_doors_own_upstream_checks_are_quiet_and_a_change_logs_once(checkpoints: dict[str, Path]) -> None:
    """Checks every half second of an upstream that is down: no line per check (httpx's own INFO lines
    included), one line as it leaves the rotation."""
    port = free_port()
    command = [sys.executable, "-m", "mmencode", "serve", "--model", str(checkpoints["qwen2_vl"]), "--port", str(port)]
    command += ["--upstream", f"http://127.0.0.1:{free_port()}", "--upstream-health-interval", "0.5"]
    process = subprocess.Popen(command, env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        time.sleep(5)  # ten checks
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    log = output.decode()
    assert "httpx" not in log and "HTTP Request" not in log, log
    assert sum("leaves the rotation" in line for line in log.splitlines()) == 1, log
