"""Only the encoder's thread parallelises torch ops: other threads never keep an OpenMP team.

An idle team in a preprocessing thread puts libgomp over its core count, after which the forward's
threads sleep at every barrier instead of spinning and the forward slows down (bench/README.md,
"Threads and cores").
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import pytest
import torch

from mmencode.app.engine.threads import SerialTorchThreadPool, serial_torch_ops, torch_threads_here

T = TypeVar("T")

CORES = torch.get_num_threads()
multicore = pytest.mark.skipif(CORES < 2, reason="torch runs one thread here: nothing to parallelise")


def _in_a_new_thread(call: Callable[[], T]) -> T:
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(call).result()


def _os_threads() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def _large_parallel_op() -> None:
    (torch.ones(4_000_000) * 2).sum()  # far above torch's grain size: split over an OpenMP team if allowed


def test_a_serial_thread_runs_torch_on_one_thread_and_leaves_the_others_alone() -> None:
    with SerialTorchThreadPool(max_workers=1) as pool:
        assert pool.submit(torch.get_num_threads).result() == 1
    with ThreadPoolExecutor(max_workers=1) as plain:
        assert plain.submit(torch.get_num_threads).result() == CORES
    assert torch.get_num_threads() == CORES


@multicore
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts OS threads through /proc")
def test_a_serial_thread_starts_no_openmp_team() -> None:
    # The control: a plain thread that runs a large op keeps a team of OS threads while it lives.
    with ThreadPoolExecutor(max_workers=1) as plain:
        plain.submit(lambda: None).result()
        before = _os_threads()
        plain.submit(_large_parallel_op).result()
        assert _os_threads() - before, "a plain thread's parallel op started no OpenMP threads: the check is blind"
    with SerialTorchThreadPool(max_workers=1) as pool:
        pool.submit(lambda: None).result()
        before = _os_threads()
        pool.submit(_large_parallel_op).result()
        assert not _os_threads() - before  # threads may end meanwhile (the plain thread's team): none may start


def test_serial_torch_ops_is_idempotent_and_results_are_unchanged() -> None:
    expected = (torch.arange(1_000_000, dtype=torch.float64) * 3).sum()

    def twice_then_compute() -> torch.Tensor:
        serial_torch_ops()
        serial_torch_ops()
        return (torch.arange(1_000_000, dtype=torch.float64) * 3).sum()

    with ThreadPoolExecutor(max_workers=1) as pool:
        assert torch.equal(pool.submit(twice_then_compute).result(), expected)


def test_a_thread_count_set_here_stays_here() -> None:
    with ThreadPoolExecutor(max_workers=1) as pool:
        assert pool.submit(lambda: (torch_threads_here(1), torch.get_num_threads())[1]).result() == 1
    assert _in_a_new_thread(torch.get_num_threads) == CORES
