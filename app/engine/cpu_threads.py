"""How many of the CPU's cores a forward should use, when the model runs on the CPU.

Every core pays for a large tower's forward; a small tower's ops are too small to split, and a forward
on every core leaves none for decoding, preprocessing and HTTP. So the choice is measured once at start
(one forward on one thread and on all, and one image's preprocessing) and the setting with the higher
images per second wins; the cost model and the measurements are in bench/README.md, "Threads and cores".

The choice lasts for the process's life, so a forward on every core that shared them with another
process (a start beside a busy neighbour) must not decide it: such a sample is timed again, for a while.
And one thread for a slow forward, the costliest verdict if wrong, is only taken if it holds a pause later.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from mmencode.app.engine.threads import torch_threads_here
from mmencode.models import EncoderAdapter, PreparedItem

__all__ = ["CALIBRATION_SIZE", "OtherProcessesMeter", "choose_forward_threads", "measure_forward_threads"]

logger = logging.getLogger("mmencode.worker")

CALIBRATION_SIZE = 448  # a photo-sized input: every family resizes it as it would a real image
_MIN_SAMPLES = 3
_BUDGET_S = 0.3  # per setting; a large tower gets its minimum of samples
# Other processes' CPU during a forward on every core, in cores, past which the sample timed the sharing.
# On two cores, one busy neighbour took 0.5-0.8 of a core and made the mid tower's forward 2-3x slower.
_SHARED_CORES = 0.25
_PATIENCE_S = 10.0  # how long to wait for a free machine before taking the times as they are
# A one-thread verdict on a forward at least this slow (the mid tower's is 0.19 s on one thread; the
# tiny test towers' about a millisecond) is timed again, this long after the first (both in seconds).
_CHECK_ONE_THREAD_ABOVE_S = 0.05
_CHECK_AGAIN_AFTER_S = 2.0


def choose_forward_threads(*, cores: int, forward_one: float, forward_all: float, preprocess: float) -> int:
    """``cores`` or 1, from one image's times (seconds): the forward on one thread, on all, its preprocessing."""
    if cores <= 1:
        return 1
    taking_turns = forward_all + preprocess / cores
    side_by_side = max(forward_one, (forward_one + preprocess) / cores)
    return 1 if side_by_side < taking_turns else cores


def measure_forward_threads(
    adapter: EncoderAdapter, cores: int, repeats: int = 3, others: OtherProcessesMeter | None = None
) -> int:
    """Time the adapter and set torch's threads to the better choice. Call it from the encoder's thread:
    the count is set for the calling thread only (``torch_threads_here``)."""
    others = others or OtherProcessesMeter()
    image = Image.new("RGB", (CALIBRATION_SIZE, CALIBRATION_SIZE), (127, 64, 200))
    # An audio-only checkpoint calibrates on its own warm-up clip.
    prepare = (lambda: adapter.preprocess(image)) if adapter.takes_images else adapter.warmup_item
    preprocess = _fastest(prepare, repeats)
    item = prepare()
    patience_ends = time.monotonic() + _PATIENCE_S
    timings = _time_both_settings(adapter, item, cores, others, patience_ends)
    chosen = timings.choice(cores, preprocess)
    checked_again = chosen == 1 and cores > 1 and timings.times[1] >= _CHECK_ONE_THREAD_ABOVE_S
    if checked_again:
        # One thread for a tower this slow is the costly verdict if it is wrong: half the throughput for
        # the process's life. A few seconds that no meter sees can give it (a host that slows one of the
        # VM's cores: the forward on every core waits for the slow one at each barrier), so both settings
        # are timed again a pause later, and the fastest time of each decides.
        time.sleep(_CHECK_AGAIN_AFTER_S)
        timings = timings.fastest_with(_time_both_settings(adapter, item, cores, others, patience_ends))
        chosen = timings.choice(cores, preprocess)
    torch_threads_here(chosen)
    what = f"a {CALIBRATION_SIZE}x{CALIBRATION_SIZE} image" if adapter.takes_images else "its warm-up audio clip"
    logger.info(
        "CPU forward threads: %d of %d (%s: forward %.1f ms on 1 thread, %.1f ms on %d; "
        "preprocessing %.1f ms%s%s)",
        chosen, cores, what,
        timings.times[1] * 1000, timings.times[cores] * 1000, cores, preprocess * 1000,
        f"; {timings.shared} forward{'s' if timings.shared > 1 else ''} on {cores} threads timed again: other "
        f"processes took up to {timings.busiest:.2f} cores" if timings.shared else "",
        f"; both timed again {_CHECK_AGAIN_AFTER_S:.0f} s after a first verdict of one thread" if checked_again else "",
    )  # fmt: skip
    if timings.shared and time.monotonic() >= patience_ends:
        logger.warning(
            "CPU forward threads: other processes kept taking up to %.2f of the %d cores through %.0f s of "
            "calibration, so the choice of %d is for a machine as busy as now (--cpu-threads sets it)",
            timings.busiest, cores, _PATIENCE_S, chosen,
        )  # fmt: skip
    return chosen


@dataclass
class _Timings:
    """The fastest forward of one image on one thread and on every core (seconds), and the forwards on
    every core that other processes shared (not counted) with the most cores they took."""

    times: dict[int, float]
    shared: int = 0
    busiest: float = 0.0

    def choice(self, cores: int, preprocess: float) -> int:
        return choose_forward_threads(
            cores=cores, forward_one=self.times[1], forward_all=self.times[cores], preprocess=preprocess
        )

    def fastest_with(self, other: _Timings) -> _Timings:
        return _Timings(
            times={threads: min(took, other.times[threads]) for threads, took in self.times.items()},
            shared=self.shared + other.shared,
            busiest=max(self.busiest, other.busiest),
        )


def _time_both_settings(
    adapter: EncoderAdapter, item: PreparedItem, cores: int, others: OtherProcessesMeter, patience_ends: float
) -> _Timings:
    timings = _Timings(times={1: float("inf"), cores: float("inf")})
    spent = dict.fromkeys(timings.times, 0.0)
    samples = 0
    while samples < _MIN_SAMPLES or min(spent.values()) < _BUDGET_S:
        for threads in timings.times:  # in turns: a machine that drifts meanwhile moves both alike
            torch_threads_here(threads)
            adapter.forward([item])  # the first forward after a change of thread count pays for the change
            if threads > 1:  # one thread leaves the other cores to neighbours: nothing to judge
                others.start()
            took = _fastest(lambda: adapter.forward([item]), 1)
            taken = others.cores_taken() if threads > 1 and time.monotonic() < patience_ends else None
            if taken is not None and taken > _SHARED_CORES:
                # Every core was asked for and some were someone else's: this times the neighbour, and
                # would hand a large tower one thread for good. Time it again.
                timings.shared, timings.busiest = timings.shared + 1, max(timings.busiest, taken)
                continue
            timings.times[threads] = min(timings.times[threads], took)
            spent[threads] += took
        samples += 1
    return timings


class OtherProcessesMeter:
    """How many cores other processes kept busy over an interval (Linux ``/proc/stat``), in cores.

    The machine's busy time, less this process's own CPU time. ``/proc/stat`` counts in clock ticks
    (10 ms), so an interval shorter than ``min_interval_s`` cannot be judged; nor can a system without
    ``/proc/stat``: ``cores_taken`` is None then.
    """

    def __init__(self, stat: Path = Path("/proc/stat"), min_interval_s: float = 0.1) -> None:
        self._stat = stat
        self._min_interval_s = min_interval_s
        self._ticks_per_s = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._start: tuple[float, float, float] | None = None

    def start(self) -> None:
        busy = self._machine_busy_s()
        self._start = None if busy is None else (time.monotonic(), busy, time.process_time())

    def cores_taken(self) -> float | None:
        if self._start is None:
            return None
        wall = time.monotonic() - self._start[0]
        if wall < self._min_interval_s:
            return None
        busy = self._machine_busy_s()
        if busy is None:
            return None
        own = time.process_time() - self._start[2]
        return max(0.0, (busy - self._start[1]) - own) / wall

    def _machine_busy_s(self) -> float | None:
        try:
            fields = self._stat.read_text().split("\n", 1)[0].split()
        except OSError:
            return None
        # cpu user nice system idle iowait irq softirq steal ...: all but idle and iowait were taken.
        ticks = [int(v) for v in fields[1:9]]
        return (sum(ticks) - ticks[3] - ticks[4]) / self._ticks_per_s


def _fastest(call: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return best
