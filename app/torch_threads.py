"""Only the encoder's thread runs torch ops in parallel; every other thread runs them on itself alone.

torch splits a large op over ``torch.get_num_threads()`` OpenMP threads, and OpenMP gives each OS
thread that starts a parallel region a team of worker threads of its own, kept for that thread's life.
In the service, a preprocessing thread that converts one image to a tensor, or the loading thread,
keeps such a team afterwards, idle. libgomp (torch's OpenMP on Linux) then manages more threads than
there are cores, and from that moment every one of its threads, the forward's included, spins only a
hundred times at a barrier before sleeping on a futex, instead of ~300,000: each of the thousands of
barriers of a CPU forward waits for a wake-up. The mid-size tower's forward took 15-50 % longer in the
service than the same forward in a process where no other thread had run a torch op (bench/README.md).

So the threads this process starts for anything but the forward (preprocessing, the event loop and its
default executor) set their own OpenMP thread count to one: an OpenMP setting is per thread, so the
encoder's thread keeps its count. This also keeps a preprocessing pool of N threads from asking for
N x cores OpenMP threads on a GPU machine, where the forward barely uses the CPU (torch's own
DataLoader workers run with one torch thread for the same reason).
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
