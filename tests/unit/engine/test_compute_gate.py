"""The compute gate: on a CPU device, preprocessing never runs while a forward has the cores."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from mmencode.app.engine.compute_gate import ComputeGate, GatedThreadPool
from mmencode.app.engine.engine import exclusive_forward_on

WAIT = 5.0


def _hold_exclusive(gate: ComputeGate, entered: threading.Event, release: threading.Event) -> threading.Thread:
    def forward() -> None:
        with gate.exclusive():
            entered.set()
            release.wait(WAIT)

    thread = threading.Thread(target=forward)
    thread.start()
    assert entered.wait(WAIT)
    return thread


def test_preprocessing_waits_for_a_running_forward() -> None:
    gate = ComputeGate(enabled=True)
    entered, release = threading.Event(), threading.Event()
    forward = _hold_exclusive(gate, entered, release)
    ran_at: list[float] = []
    with GatedThreadPool(gate, max_workers=2) as pool:
        future = pool.submit(lambda: ran_at.append(time.monotonic()))
        time.sleep(0.2)
        assert not ran_at, "preprocessing ran while the forward held the CPU"
        released_at = time.monotonic()
        release.set()
        future.result(WAIT)
    forward.join(WAIT)
    assert ran_at[0] >= released_at


def test_a_waiting_forward_goes_before_preprocessing_not_yet_started() -> None:
    gate = ComputeGate(enabled=True)
    order: list[str] = []
    running, finish_running = threading.Event(), threading.Event()

    def long_preprocess() -> None:
        with gate.shared():
            running.set()
            finish_running.wait(WAIT)
            order.append("preprocess 1")

    def forward() -> None:
        with gate.exclusive():
            order.append("forward")

    def late_preprocess() -> None:
        with gate.shared():
            order.append("preprocess 2")

    first = threading.Thread(target=long_preprocess)
    first.start()
    assert running.wait(WAIT)
    waiting_forward = threading.Thread(target=forward)
    waiting_forward.start()
    time.sleep(0.1)  # the forward is now waiting for the running preprocessing
    late = threading.Thread(target=late_preprocess)
    late.start()
    time.sleep(0.1)
    finish_running.set()
    for thread in (first, waiting_forward, late):
        thread.join(WAIT)
    assert order == ["preprocess 1", "forward", "preprocess 2"]


def test_preprocessing_tasks_share_the_gate_with_each_other() -> None:
    gate = ComputeGate(enabled=True)
    both_inside = threading.Barrier(2, timeout=WAIT)
    with GatedThreadPool(gate, max_workers=2) as pool:
        futures = [pool.submit(both_inside.wait) for _ in range(2)]
        for future in futures:
            future.result(WAIT)  # a BrokenBarrierError here: they ran one at a time


def test_an_open_gate_never_blocks() -> None:
    gate = ComputeGate(enabled=False)
    entered, release = threading.Event(), threading.Event()
    forward = _hold_exclusive(gate, entered, release)
    with GatedThreadPool(gate, max_workers=1) as pool:
        assert pool.submit(lambda: 42).result(WAIT) == 42
    release.set()
    forward.join(WAIT)


def test_a_failing_task_releases_the_gate() -> None:
    gate = ComputeGate(enabled=True)
    with GatedThreadPool(gate, max_workers=1) as pool, pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result(WAIT)
    entered, release = threading.Event(), threading.Event()
    release.set()
    _hold_exclusive(gate, entered, release).join(WAIT)


@pytest.mark.parametrize(
    ("configured", "device", "expected"),
    [(None, "cpu", True), (None, "cuda", False), (False, "cpu", False), (True, "cuda", True)],
)
def test_forwards_are_exclusive_on_the_cpu_by_default(configured: bool | None, device: str, expected: bool) -> None:
    assert exclusive_forward_on(configured, torch.device(device)) is expected
