"""A served model's threads, as `mmencode serve` sets them up: only the encoder's thread parallelises torch
ops, and a forward that runs beside preprocessing makes batches wait for it (app/engine/threads.py,
app/engine/engine.py's batch_wait_seconds)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import httpx
import pytest
import torch

from mmencode.app.engine.engine import Engine
from mmencode.app.engine.threads import in_executor
from tests.helpers import data_uri, live_server, noise_image

T = TypeVar("T")

CORES = torch.get_num_threads()
multicore = pytest.mark.skipif(CORES < 2, reason="torch runs one thread here: nothing to parallelise")


def _in_a_new_thread(call: Callable[[], T]) -> T:
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(call).result()


@multicore
def test_a_served_model_parallelises_only_in_the_encoders_thread(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    with live_server(model=checkpoints["qwen2_vl"], cache_dir=tmp_path, cpu_threads=CORES) as server:
        response = httpx.post(
            server.url + "/v1/encode", json={"items": [{"image": data_uri(noise_image(96, 64))}]}, timeout=60
        )
        assert response.status_code == 200, response.text
        engine: Engine = server.server.config.app.state.engine
        worker = engine.worker
        assert worker is not None and worker._task is not None
        loop = worker._task.get_loop()

        # The engine's own executor for blocking work; the loop's thread and default executor are the
        # process's, which `mmencode serve` tunes (tests/e2e/test_process.py).
        io = asyncio.run_coroutine_threadsafe(in_executor(engine.io_executor, torch.get_num_threads), loop).result()
        preprocessing = engine._pool.submit(torch.get_num_threads).result()
        encoder = worker._executor.submit(torch.get_num_threads).result()
    assert (io, preprocessing) == (1, 1)
    assert encoder == worker.forward_threads == CORES
    # The encoder's count is its thread's own: a thread started now still takes the process's default.
    assert _in_a_new_thread(torch.get_num_threads) == CORES


@pytest.mark.parametrize(("cpu_threads", "wait_s"), [(1, 0.020), (2, 0.002)])
def test_a_served_model_on_the_cpu_waits_longer_when_its_forward_runs_beside_preprocessing(
    checkpoints: dict[str, Path], tmp_path: Path, cpu_threads: int, wait_s: float
) -> None:
    # One forward thread: the forward shares the CPU with preprocessing (no turns), so batches wait.
    with live_server(model=checkpoints["qwen2_vl"], cache_dir=tmp_path, cpu_threads=cpu_threads) as server:
        engine: Engine = server.server.config.app.state.engine
        assert engine.worker is not None
        assert engine.compute_gate.enabled is (cpu_threads > 1)
        assert engine.worker.batch_wait_s == pytest.approx(wait_s)
        # What the forward got is on /metrics: a start that chose one thread for a large tower shows.
        metrics = httpx.get(server.url + "/metrics").text
        assert f"mmencode_cpu_forward_threads {float(cpu_threads)}" in metrics
