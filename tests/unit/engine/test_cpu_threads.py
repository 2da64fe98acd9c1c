"""How many threads a CPU forward uses: all cores for a tower that gains from them, one for a small one."""

from __future__ import annotations

import logging
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import cast

import pytest
import torch
from PIL import Image

from mmencode.app.engine import cpu_threads
from mmencode.app.engine.cpu_threads import OtherProcessesMeter, choose_forward_threads, measure_forward_threads
from mmencode.app.engine.worker import EncoderWorker
from mmencode.models import EncoderAdapter, load_encoder


def test_a_tower_that_gains_from_every_core_gets_them() -> None:
    # The mid-size Qwen2-VL tower on two cores (bench/README.md): 180 ms on one thread, 120 on two.
    assert choose_forward_threads(cores=2, forward_one=0.180, forward_all=0.120, preprocess=0.013) == 2


def test_timing_noise_does_not_flip_the_choice_either_way() -> None:
    # The mid tower timed on one thread in a fast minute and on two in a slow one: still both cores.
    assert choose_forward_threads(cores=2, forward_one=0.140, forward_all=0.125, preprocess=0.0034) == 2
    # A tiny CLIP whose millisecond forwards happened to look faster on two threads: still one, since
    # the core it leaves free preprocesses meanwhile.
    assert choose_forward_threads(cores=2, forward_one=0.0013, forward_all=0.0009, preprocess=0.0017) == 1


def test_a_small_tower_runs_on_one_thread_and_leaves_the_rest_to_preprocessing() -> None:
    # A tiny CLIP: its ops are too small to split; two threads are no faster than one.
    assert choose_forward_threads(cores=2, forward_one=0.0007, forward_all=0.0008, preprocess=0.0009) == 1
    # Faster on every core, but not by enough to pay for the cores preprocessing loses meanwhile.
    assert choose_forward_threads(cores=4, forward_one=0.010, forward_all=0.008, preprocess=0.012) == 1


def test_one_core_is_one_thread() -> None:
    assert choose_forward_threads(cores=1, forward_one=0.1, forward_all=0.1, preprocess=0.1) == 1


@pytest.mark.parametrize("configured", [1, 2])
def test_a_configured_thread_count_is_used_in_the_encoder_thread(checkpoints: dict[str, Path], configured: int) -> None:
    adapter = load_encoder(checkpoints["clip"], device=torch.device("cpu"), dtype=torch.float32)
    worker = EncoderWorker(adapter, max_batch_tokens=512, max_batch_items=8, batch_wait_s=0, max_queue=8)
    threads_before = torch.get_num_threads()
    worker.warmup(configured)
    assert worker.forward_threads == configured
    seen = worker._executor.submit(torch.get_num_threads).result()
    assert seen == configured
    assert torch.get_num_threads() == threads_before  # the caller's thread is left as it was
    worker._executor.shutdown()


def test_unset_threads_are_measured(checkpoints: dict[str, Path]) -> None:
    adapter = load_encoder(checkpoints["clip"], device=torch.device("cpu"), dtype=torch.float32)
    worker = EncoderWorker(adapter, max_batch_tokens=512, max_batch_items=8, batch_wait_s=0, max_queue=8)
    worker.warmup()
    assert worker.forward_threads in {1, torch.get_num_threads()}
    worker._executor.shutdown()


class _Neighbour(OtherProcessesMeter):
    """Another process that keeps most of a core busy until ``busy_until`` (monotonic seconds)."""

    def __init__(self, busy_until: float) -> None:
        super().__init__()
        self.busy_until = busy_until

    @property
    def busy(self) -> bool:
        return time.monotonic() < self.busy_until

    def start(self) -> None:
        self._busy_at_start = self.busy

    def cores_taken(self) -> float | None:
        return 0.7 if self._busy_at_start or self.busy else 0.0


class _TowerOfKnownCost:
    """A forward's cost as the mid tower's on two cores: 20 ms on one thread, 12 on two, and on two
    threads 50 ms while the neighbour shares a core with one of them. Only the calibration's loop is
    under test here; the real towers' calibration is checked above and in test_worker/test_process_edge."""

    takes_images = True

    def __init__(self, neighbour: _Neighbour) -> None:
        self.neighbour = neighbour

    def preprocess(self, image: Image.Image) -> object:
        return image

    def forward(self, items: list[object]) -> None:
        if torch.get_num_threads() == 1:
            time.sleep(0.020)
        else:
            time.sleep(0.050 if self.neighbour.busy else 0.012)


def _calibrate(neighbour: _Neighbour) -> int:
    adapter = cast(EncoderAdapter, _TowerOfKnownCost(neighbour))
    with ThreadPoolExecutor(max_workers=1) as own_thread:  # the thread count is set for the calling thread
        return own_thread.submit(measure_forward_threads, adapter, 2, 1, neighbour).result()


def test_a_neighbour_busy_at_start_does_not_cost_a_large_tower_its_cores(caplog: pytest.LogCaptureFixture) -> None:
    # Timed while another process held a core, the forward on two threads looks slower than on one,
    # and the process would then run its whole life on one thread, at about half its throughput.
    with caplog.at_level(logging.INFO, logger="mmencode.worker"):
        assert _calibrate(_Neighbour(busy_until=time.monotonic() + 0.5)) == 2
    assert "on 2 threads timed again: other processes took up to 0.70 cores" in caplog.text


def test_a_machine_that_stays_busy_is_measured_as_it_is(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A host whose other tenants never let go (or a CPU quota under the visible cores): waiting longer
    # would only delay the start; the times as they are decide, and the log says so.
    monkeypatch.setattr(cpu_threads, "_PATIENCE_S", 0.5)
    with caplog.at_level(logging.INFO, logger="mmencode.worker"):
        assert _calibrate(_Neighbour(busy_until=float("inf"))) == 1
    warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "other processes kept taking up to 0.70 of the 2 cores" in warnings[0].getMessage()
    assert "--cpu-threads" in warnings[0].getMessage()


class _UnseenNeighbour(_Neighbour):
    """A slowdown no meter sees: the host's other tenants on one of the VM's cores, say."""

    def cores_taken(self) -> float | None:
        return 0.0


def test_a_one_thread_verdict_that_does_not_hold_a_pause_later_is_dropped(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Two seconds in which the forward on two threads looked slower than on one, unseen by the meter:
    # without a second look, half the throughput for the process's life.
    monkeypatch.setattr(cpu_threads, "_BUDGET_S", 0.0)  # the minimum of samples: a pass of about 0.4 s
    monkeypatch.setattr(cpu_threads, "_CHECK_ONE_THREAD_ABOVE_S", 0.015)  # the stand-in's 20 ms counts as slow
    with caplog.at_level(logging.INFO, logger="mmencode.worker"):
        assert _calibrate(_UnseenNeighbour(busy_until=time.monotonic() + 1.5)) == 2
    assert "both timed again 2 s after a first verdict of one thread" in caplog.text
    # The fastest of both passes: the second's 12 ms on two threads, not the first's 50.
    on_two = re.search(r"([\d.]+) ms on 2;", caplog.text)
    assert on_two is not None and float(on_two.group(1)) < 20


def test_a_one_thread_verdict_that_holds_stands(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A machine whose cores stay unequal: the second look agrees, and one thread it is.
    monkeypatch.setattr(cpu_threads, "_BUDGET_S", 0.0)
    monkeypatch.setattr(cpu_threads, "_CHECK_ONE_THREAD_ABOVE_S", 0.015)
    monkeypatch.setattr(cpu_threads, "_CHECK_AGAIN_AFTER_S", 0.1)
    with caplog.at_level(logging.INFO, logger="mmencode.worker"):
        assert _calibrate(_UnseenNeighbour(busy_until=float("inf"))) == 1
    assert "timed again" in caplog.text


def test_a_fast_forward_takes_its_one_thread_verdict_at_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Under the threshold (the small towers, whose verdict is one thread anyway) the start is not delayed.
    monkeypatch.setattr(cpu_threads, "_BUDGET_S", 0.0)
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="mmencode.worker"):
        assert _calibrate(_UnseenNeighbour(busy_until=float("inf"))) == 1
    assert "timed again" not in caplog.text
    assert time.monotonic() - started < cpu_threads._CHECK_AGAIN_AFTER_S


def test_the_meter_counts_other_processes_not_this_one(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    ticks = os.sysconf("SC_CLK_TCK")

    def write(busy_ticks: int) -> None:  # user nice system idle iowait irq softirq steal
        stat.write_text(f"cpu  {busy_ticks} 0 0 5000 7 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")

    meter = OtherProcessesMeter(stat, min_interval_s=0.0)
    write(1000)
    started = time.monotonic()
    meter.start()
    own_started = time.process_time()
    deadline = time.monotonic() + 0.2
    while time.monotonic() < deadline:  # this process busy on one core
        pass
    own = time.process_time() - own_started
    write(1000 + round((own + 0.2) * ticks))  # its CPU, and 0.2 s of another process's on top
    taken = meter.cores_taken()
    wall = time.monotonic() - started
    assert taken is not None
    # 0.2 s of another process's CPU over the interval (about 0.2 s, longer on a busy test machine):
    # what this process used itself is not counted.
    assert taken == pytest.approx(0.2 / wall, rel=0.2)

    meter.start()
    write(1000 + round((own + 0.2) * ticks))  # nothing more
    assert meter.cores_taken() == 0.0


def test_the_meter_abstains_where_it_cannot_judge(tmp_path: Path) -> None:
    missing = OtherProcessesMeter(tmp_path / "no-such-stat", min_interval_s=0.0)
    missing.start()
    assert missing.cores_taken() is None
    too_short = OtherProcessesMeter(min_interval_s=60.0)  # /proc/stat counts in 10 ms ticks
    too_short.start()
    assert too_short.cores_taken() is None
