"""How many of the CPU's cores a forward should use, when the model runs on the CPU.

Every core pays for a large tower's forward; a small tower's ops are too small to split, and a forward
on every core leaves none for decoding, preprocessing and HTTP. So the choice is measured once at start
(one forward on one thread and on all, and one image's preprocessing) and the setting with the higher
images per second wins; the cost model and the measurements are in bench/README.md, "Threads and cores".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from PIL import Image

from mmencode.app.torch_threads import torch_threads_here
from mmencode.models import EncoderAdapter

__all__ = ["CALIBRATION_SIZE", "choose_forward_threads", "measure_forward_threads"]

logger = logging.getLogger("mmencode.worker")

CALIBRATION_SIZE = 448  # a photo-sized input: every family resizes it as it would a real image
_MIN_SAMPLES = 3
_BUDGET_S = 0.3  # per setting; a large tower gets its minimum of samples


def choose_forward_threads(*, cores: int, forward_one: float, forward_all: float, preprocess: float) -> int:
    """``cores`` or 1, from one image's times (seconds): the forward on one thread, on all, its preprocessing."""
    if cores <= 1:
        return 1
    taking_turns = forward_all + preprocess / cores
    side_by_side = max(forward_one, (forward_one + preprocess) / cores)
    return 1 if side_by_side < taking_turns else cores


def measure_forward_threads(adapter: EncoderAdapter, cores: int, repeats: int = 3) -> int:
    """Time the adapter and set torch's threads to the better choice. Call it from the encoder's thread:
    the count is set for the calling thread only (``torch_threads_here``)."""
    image = Image.new("RGB", (CALIBRATION_SIZE, CALIBRATION_SIZE), (127, 64, 200))
    # An audio-only checkpoint calibrates on its own warm-up clip.
    prepare = (lambda: adapter.preprocess(image)) if adapter.takes_images else adapter.warmup_item
    preprocess = _fastest(prepare, repeats)
    item = prepare()
    times = {1: float("inf"), cores: float("inf")}
    spent = dict.fromkeys(times, 0.0)
    samples = 0
    while samples < _MIN_SAMPLES or min(spent.values()) < _BUDGET_S:
        for threads in times:  # in turns: a machine that drifts meanwhile moves both alike
            torch_threads_here(threads)
            adapter.forward([item])  # the first forward after a change of thread count pays for the change
            took = _fastest(lambda: adapter.forward([item]), 1)
            times[threads] = min(times[threads], took)
            spent[threads] += took
        samples += 1
    chosen = choose_forward_threads(cores=cores, forward_one=times[1], forward_all=times[cores], preprocess=preprocess)
    torch_threads_here(chosen)
    logger.info(
        "CPU forward threads: %d of %d (a %dx%d image: forward %.1f ms on 1 thread, %.1f ms on %d; "
        "preprocessing %.1f ms)",
        chosen, cores, CALIBRATION_SIZE, CALIBRATION_SIZE,
        times[1] * 1000, times[cores] * 1000, cores, preprocess * 1000,
    )  # fmt: skip
    return chosen


def _fastest(call: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return best
