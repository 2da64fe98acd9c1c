"""bench.thread_cpu reads each thread's CPU time and context switches from /proc: a busy thread shows."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from bench.thread_cpu import thread_usage

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc")


def test_a_busy_thread_shows_its_cpu_time_and_an_idle_one_does_not() -> None:
    ids: dict[str, int] = {}
    release = threading.Event()

    def busy() -> None:
        ids["busy"] = threading.get_native_id()
        while time.thread_time() < 0.3:  # CPU time, not wall time: a loaded machine only makes it longer
            pass
        release.wait(10)

    def idle() -> None:
        ids["idle"] = threading.get_native_id()
        release.wait(10)

    threads = [threading.Thread(target=busy), threading.Thread(target=idle)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    while len(ids) < 2 or thread_usage(os.getpid())[ids["busy"]].cpu_s < 0.25:
        assert time.monotonic() < deadline, "the busy thread never showed 0.25 s of CPU"
        time.sleep(0.01)
    usage = thread_usage(os.getpid())
    release.set()
    for thread in threads:
        thread.join()
    assert usage[ids["busy"]].cpu_s >= 0.25
    assert usage[ids["idle"]].cpu_s < 0.05
    assert usage[ids["idle"]].voluntary_switches >= 1  # it slept on the event
