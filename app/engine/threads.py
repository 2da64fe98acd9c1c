"""Only the encoder's thread runs torch ops in parallel; every other thread runs them on itself alone.

OpenMP keeps a team of worker threads for every OS thread that ever ran a parallel torch op; idle teams
in preprocessing or loading threads oversubscribe the cores and slow the encoder's forward, so every
thread but the encoder's sets its own (per-thread) OpenMP count to one. The mechanism and the
measurements are in bench/README.md, "Threads and cores".
"""

from __future__ import annotations

import asyncio
import contextvars
import ctypes
import functools
import logging
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import torch
from threadpoolctl import ThreadpoolController

__all__ = ["SerialTorchThreadPool", "in_executor", "serial_torch_ops", "torch_threads_here"]

T = TypeVar("T")

logger = logging.getLogger("mmencode.torch_threads")


@functools.cache
def _controller() -> ThreadpoolController:
    # The OpenMP runtimes loaded in this process (torch's libgomp, or libomp/libiomp/vcomp elsewhere),
    # found once: torch is imported by now, so its runtime is among them.
    return ThreadpoolController().select(user_api="openmp")


@functools.cache
def _mkl_set_num_threads_local() -> Callable[[int], Any] | None:
    """MKL's per-thread count (torch links MKL statically and sets it beside OpenMP's); None without MKL."""
    if not torch.backends.mkl.is_available():
        return None
    for name in ("libtorch_cpu.so", "libtorch_cpu.dylib", "torch_cpu.dll"):
        path = Path(torch.__file__).parent / "lib" / name
        if path.is_file():
            try:
                return ctypes.CDLL(str(path)).MKL_Set_Num_Threads_Local
            except (OSError, AttributeError):
                return None
    return None


def torch_threads_here(count: int) -> None:
    """From now on, torch ops called in this thread use ``count`` threads; other threads keep theirs.

    What ``torch.set_num_threads`` sets for its thread (OpenMP's and MKL's per-thread counts), without
    the process-wide default it also sets, which every thread started later takes: one app's encoder
    would change the threads of every other app (and test) in the process.
    """
    # torch sets a thread's counts on its first parallel op, from the process-wide setting;
    # asking for the count does that now, so it cannot undo the limit below later.
    torch.get_num_threads()
    try:
        _controller().limit(limits=count)  # omp_set_num_threads: this thread's setting only
        mkl_local = _mkl_set_num_threads_local()
        if mkl_local is not None:
            mkl_local(count)  # mkl_set_num_threads_local's C entry: MKL's products follow it, not OpenMP's
    except Exception:  # an OpenMP runtime that refuses: slower forwards, never a failed thread
        logger.warning("could not set torch's threads in this thread", exc_info=True)


def serial_torch_ops() -> None:
    """From now on, torch ops called in this thread run in it alone, without an OpenMP team."""
    torch_threads_here(1)


async def in_executor(executor: Executor | None, call: Callable[..., T], *args: Any) -> T:
    """``asyncio.to_thread`` on a given executor (``None``: the loop's default), context variables included."""
    context = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(executor, functools.partial(context.run, call, *args))


class SerialTorchThreadPool(ThreadPoolExecutor):
    """A thread pool whose threads run torch ops serially (``serial_torch_ops``)."""

    def __init__(self, max_workers: int | None = None, thread_name_prefix: str = "") -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix=thread_name_prefix, initializer=serial_torch_ops)
