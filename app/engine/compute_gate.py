"""Who may use the CPU while the encoder runs on it.

On a CPU device the forward is one parallel region over every core (torch's intra-op threads); the
decoding and preprocessing pool wants the same cores. Run together, they oversubscribe: each of the
forward's threads gets a fraction of a core, the slowest one holds every barrier, and the forward of
a batch takes longer than preprocessing and forward one after the other would (bench/README.md). The
gate lets preprocessing share the CPU with itself and gives a forward the CPU to itself; a forward
that waits goes before preprocessing that has not started yet, so batches never starve.

On CUDA the forward barely uses the CPU, and preprocessing the next batch while the GPU runs this
one is the point: there the gate is open (a no-op).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

__all__ = ["ComputeGate", "GatedThreadPool"]

P = ParamSpec("P")
T = TypeVar("T")


class ComputeGate:
    """A readers-writer lock that prefers writers: preprocessing is shared, a forward exclusive."""

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled
        self._condition = threading.Condition()
        self._sharing = 0  # preprocessing tasks running
        self._exclusive = False  # a forward running
        self._waiting_exclusive = 0  # forwards waiting for the running preprocessing to finish

    @contextmanager
    def shared(self) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        with self._condition:
            self._condition.wait_for(lambda: not self._exclusive and not self._waiting_exclusive)
            self._sharing += 1
        try:
            yield
        finally:
            with self._condition:
                self._sharing -= 1
                if not self._sharing:
                    self._condition.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        with self._condition:
            self._waiting_exclusive += 1
            try:
                self._condition.wait_for(lambda: not self._exclusive and not self._sharing)
            finally:
                self._waiting_exclusive -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._condition:
                self._exclusive = False
                self._condition.notify_all()


class GatedThreadPool(ThreadPoolExecutor):
    """A thread pool whose every task holds the gate's shared side while it runs."""

    def __init__(
        self,
        gate: ComputeGate,
        *,
        max_workers: int,
        thread_name_prefix: str = "",
        initializer: Callable[[], object] | None = None,
    ) -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix=thread_name_prefix, initializer=initializer)
        self.gate = gate

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        return super().submit(self._run_shared, functools.partial(fn, *args, **kwargs))

    def _run_shared(self, call: Callable[[], T]) -> T:
        with self.gate.shared():
            return call()
