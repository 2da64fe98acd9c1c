"""Process-wide tuning is `mmencode serve`'s: ``create_app`` and an app's lifecycle leave the process alone.

Several apps live in one process (tests start servers in threads): one app's GC freeze, executor or
torch thread count must not reach the others.
"""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import pytest
import torch
from fastapi import FastAPI

from mmencode.app.cli import tuned_for_serving
from mmencode.app.config import Settings
from mmencode.app.engine.engine import Engine, Phase
from mmencode.app.server import create_app

T = TypeVar("T")


def _in_a_new_thread(call: Callable[[], T]) -> T:
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(call).result()


def _settings(model: Path, cache_dir: Path) -> Settings:
    # cpu_threads unset: the worker measures and sets its forward threads, as served.
    return Settings(model=model, cache_dir=cache_dir, device="cpu")


async def _until_ready(engine: Engine) -> None:
    async with asyncio.timeout(120):
        while not engine.ready:
            assert engine.phase is not Phase.FAILED, engine.failure
            await asyncio.sleep(0.02)


def _process_state() -> dict[str, object]:
    return {
        "gc frozen": gc.get_freeze_count(),
        "this thread's torch threads": torch.get_num_threads(),
        "a new thread's torch threads": _in_a_new_thread(torch.get_num_threads),
    }


async def _default_executor_thread() -> str:
    return await asyncio.get_running_loop().run_in_executor(None, lambda: threading.current_thread().name)


def test_two_apps_in_one_process_leave_its_gc_executor_and_threads_alone(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    before = _process_state()
    first = create_app(_settings(checkpoints["qwen2_vl"], tmp_path / "first"))
    second = create_app(_settings(checkpoints["clip-vision"], tmp_path / "second"))
    assert _process_state() == before  # building

    async def run(app: FastAPI) -> None:
        async with app.router.lifespan_context(app):
            await _until_ready(app.state.engine)
            assert _process_state() == before  # started: loaded, warmed up, calibrated
            # The loop's default executor is still the loop's own (asyncio names its threads so).
            assert (await _default_executor_thread()).startswith("asyncio")

    async def both() -> None:
        async with first.router.lifespan_context(first):
            await _until_ready(first.state.engine)
            await run(second)  # a second app starts and stops beside the first
            assert first.state.engine.ready
            assert _process_state() == before

    asyncio.run(both())
    assert _process_state() == before  # stopped


def test_serve_tunes_its_process(checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    frozen_before = gc.get_freeze_count()
    malloc_tuned: list[bool] = []
    monkeypatch.setattr("mmencode.app.process.malloc.keep_large_blocks_in_heap", lambda: malloc_tuned.append(True))
    app = create_app(_settings(checkpoints["qwen2_vl"], tmp_path))
    engine: Engine = app.state.engine

    async def serve() -> tuple[int, int]:
        async with app.router.lifespan_context(app):
            await _until_ready(engine)
            return gc.get_freeze_count(), torch.get_num_threads()

    def serve_in_this_thread() -> tuple[int, int]:
        # serve's thread runs the event loop; tuning it leaves the test's thread alone.
        with tuned_for_serving(engine):
            return asyncio.run(serve())

    frozen_when_ready, loop_threads = _in_a_new_thread(serve_in_this_thread)
    assert frozen_when_ready > frozen_before  # what loading left alive is out of GC's walk
    assert loop_threads == 1  # the event loop's thread runs torch ops serially
    assert gc.get_freeze_count() == 0  # unfrozen when serving ends
    assert malloc_tuned == [True]  # glibc's thresholds set (app/process/malloc.py; their effect: test_malloc_tuning.py)


def test_building_a_tiny_checkpoint_leaves_the_global_rng_alone(tmp_path: Path) -> None:
    from mmencode.models.tiny import build_tiny

    torch.manual_seed(1234)
    expected = torch.rand(4)
    torch.manual_seed(1234)
    build_tiny(tmp_path / "clip", "clip", layout="vision")
    assert torch.equal(torch.rand(4), expected)


def test_serving_a_model_directory_never_imports_the_tiny_checkpoint_builder(tmp_path: Path) -> None:
    # The builder is test and embedded-default code: a served --model must not pay for it or depend on it.
    code = (
        "import sys\n"
        "from mmencode.app.config import Settings\n"
        "from mmencode.app.server import create_app\n"
        f"create_app(Settings(model={str(tmp_path)!r}))\n"
        "print(sorted(name for name in sys.modules if name.startswith('mmencode.models.tiny')))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
