"""Only the encoder's thread runs torch ops in parallel; every other thread runs them on itself alone.

OpenMP keeps a team of worker threads for every OS thread that ever ran a parallel torch op; idle teams
in preprocessing or loading threads oversubscribe the cores and slow the encoder's forward, so every
thread but the encoder's sets its own (per-thread) OpenMP count to one. The mechanism and the
measurements are in bench/README.md, "Threads and cores".
"""

from __future__ import annotations

import functools
import logging
from concurrent.futures import ThreadPoolExecutor

import torch
from threadpoolctl import ThreadpoolController

__all__ = ["SerialTorchThreadPool", "serial_torch_ops"]

logger = logging.getLogger("mmencode.torch_threads")


@functools.cache
def _controller() -> ThreadpoolController:
    # The OpenMP runtimes loaded in this process (torch's libgomp, or libomp/libiomp/vcomp elsewhere),
    # found once: torch is imported by now, so its runtime is among them.
    return ThreadpoolController().select(user_api="openmp")


def serial_torch_ops() -> None:
    """From now on, torch ops called in this thread run in it alone, without an OpenMP team."""
    # torch sets a thread's OpenMP count on its first parallel op, from the process-wide setting;
    # asking for the count does that now, so it cannot undo the limit below later.
    torch.get_num_threads()
    try:
        _controller().limit(limits=1)  # omp_set_num_threads(1): this thread's setting only
    except Exception:  # an OpenMP runtime that refuses: slower forwards, never a failed thread
        logger.warning("could not limit torch's OpenMP threads in this thread", exc_info=True)


class SerialTorchThreadPool(ThreadPoolExecutor):
    """A thread pool whose threads run torch ops serially (``serial_torch_ops``)."""

    def __init__(self, max_workers: int | None = None, thread_name_prefix: str = "") -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix=thread_name_prefix, initializer=serial_torch_ops)
