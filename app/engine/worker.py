"""The encoder worker: owns the model on its device, batches across requests, checks every row count.

One asyncio task collects jobs (one job = the items of one request that need the encoder) into a batch
bounded by items and rows, waiting at most ``batch_wait`` for the requests already being decoded and
preprocessed (a batch with none on their way starts at once); one dedicated thread runs the
forward, so the event loop never blocks and the model only ever sees one thread. Output rows are sliced
per item with the *preprocessor's* predicted counts and checked against what the encoder produced.
A batch that raises or drifts is re-run job by job, so only the requests that caused it fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from mmencode.app.engine.compute_gate import ComputeGate
from mmencode.app.engine.cpu_threads import measure_forward_threads
from mmencode.app.engine.threads import torch_threads_here
from mmencode.app.metrics import Metrics
from mmencode.models import EncoderAdapter, EncoderOutput, PreparedItem

__all__ = [
    "EncoderWorker",
    "QueueBytesFull",
    "QueueFull",
    "Reservation",
    "TokenDrift",
    "WorkerStopped",
    "prepared_nbytes",
]

logger = logging.getLogger("mmencode.worker")


class QueueFull(Exception):
    """The bounded queue is full: admission refused."""


class WorkerStopped(Exception):
    """The worker is not running (not started, draining finished, or dead)."""


class TokenDrift(Exception):
    """The encoder produced a different number of rows than the preprocessor predicted.

    ``expected`` holds the prediction per item of the job; ``produced`` holds the observed rows per
    item, or ``None`` when the encoder's output only tells the total.
    """

    def __init__(self, expected: list[int], produced_total: int, produced: list[int] | None) -> None:
        super().__init__(f"encoder produced {produced_total} rows, the preprocessor predicted {sum(expected)}")
        self.expected = expected
        self.produced_total = produced_total
        self.produced = produced


class Reservation:
    """A request's place in the encoder queue, held from before preprocessing until its forward begins.

    Taken before any decoding, so an overloaded service refuses a request before spending CPU on it,
    and so requests still being preprocessed count as waiting (on a CPU device they wait for the
    forward's cores: app/engine/compute_gate.py). Releasing twice is harmless.
    """

    def __init__(self, worker: EncoderWorker) -> None:
        self._worker: EncoderWorker | None = worker

    def release(self) -> None:
        if self._worker is not None:
            self._worker._unreserve()
            self._worker = None

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


class QueueBytesFull(QueueFull):
    """The prepared inputs already waiting for the encoder hold the byte budget: admission refused."""

    def __init__(self, queued_bytes: int, job_bytes: int, max_bytes: int) -> None:
        super().__init__(f"{queued_bytes} bytes queued, {job_bytes} more asked, limit {max_bytes}")
        self.queued_bytes = queued_bytes
        self.job_bytes = job_bytes
        self.max_bytes = max_bytes


@dataclass(eq=False)
class _Job:
    items: Sequence[PreparedItem]
    future: asyncio.Future[list[torch.Tensor]]
    reservation: Reservation
    tokens: int = field(init=False)
    nbytes: int = field(init=False)
    enqueued_at: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.tokens = sum(item.num_tokens for item in self.items)
        self.nbytes = sum(prepared_nbytes(item) for item in self.items)


def prepared_nbytes(item: PreparedItem) -> int:
    """The memory an item's model inputs hold until its forward ends (a video's frames as pixel patches)."""
    return sum(int(tensor.untyped_storage().nbytes()) for tensor in item.tensors.values())


_Outcome = list[torch.Tensor] | BaseException


class EncoderWorker:
    def __init__(
        self,
        adapter: EncoderAdapter,
        *,
        max_batch_tokens: int,
        max_batch_items: int,
        batch_wait_s: float,
        max_queue: int,
        max_queue_bytes: int | None = None,
        metrics: Metrics | None = None,
        gate: ComputeGate | None = None,
    ) -> None:
        self.adapter = adapter
        self.metrics = metrics or Metrics()
        # Held exclusively around each forward: on a CPU device, preprocessing waits meanwhile.
        self.gate = gate or ComputeGate(enabled=False)
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_items = max_batch_items
        self.batch_wait_s = batch_wait_s
        self.max_queue = max_queue
        # Bytes of model inputs waiting for a forward or in it; None: no budget.
        self.max_queue_bytes = max_queue_bytes
        self._queued_bytes = 0
        # Unbounded in jobs: reservations (at most max_queue) bound what waits here, and max_queue_bytes
        # what it holds.
        self._queue: asyncio.Queue[_Job] = asyncio.Queue()
        self._reserved = 0
        self._unreserved = asyncio.Event()  # set while no reservation is held
        self._unreserved.set()
        self._arrival = asyncio.Event()  # set when a job is queued or a reservation ends
        self._carry: _Job | None = None  # taken from the queue but over the budget of the last batch
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mmencode-encoder")
        self.forward_threads: int | None = None  # on a CPU device, once warmed up
        self._task: asyncio.Task[None] | None = None
        self._pending = 0

    # ----- lifecycle -----
    def warmup(self, cpu_threads: int | None = None) -> None:
        """One forward on a small image, blocking; readiness waits on it.

        On a CPU device, also sets how many threads each forward uses (``cpu_threads``, or measured:
        app/engine/cpu_threads.py), in the thread that runs the forwards, since torch's setting is per thread.
        """
        self._executor.submit(self._warmup, cpu_threads).result()

    def _warmup(self, cpu_threads: int | None) -> None:
        self.adapter.forward([self.adapter.warmup_item()])
        if self.adapter.device.type != "cpu":
            return
        if cpu_threads is None:
            cpu_threads = measure_forward_threads(self.adapter, cores=torch.get_num_threads())
        torch_threads_here(cpu_threads)  # this thread's count only: other threads and apps keep theirs
        self.forward_threads = cpu_threads
        self.metrics.cpu_forward_threads.set(cpu_threads)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="mmencode-worker")

    @property
    def alive(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def queue_depth(self) -> int:
        """Requests waiting for a forward: being preprocessed, or queued."""
        return self._reserved

    @property
    def queue_bytes(self) -> int:
        """Bytes of model inputs held for the encoder: queued, or in the running forward."""
        return self._queued_bytes

    @property
    def pending(self) -> int:
        """Requests accepted and not yet answered: waiting or in the running forward."""
        return self._pending

    async def drain(self, grace_s: float) -> None:
        """Let queued and running work finish (for at most ``grace_s``), then stop."""
        if self.alive:
            try:
                async with asyncio.timeout(grace_s):
                    await self._unreserved.wait()  # requests still being preprocessed: their forwards are coming
                    await self._queue.join()
            except TimeoutError:
                logger.warning("drain: %d requests still queued after %.0fs; failing them", self.queue_depth, grace_s)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._executor.shutdown(wait=True)

    # ----- API -----
    def reserve(self) -> Reservation:
        """A place in the queue for a request about to be preprocessed. Raises QueueFull or WorkerStopped."""
        if not self.alive:
            raise WorkerStopped("the encoder worker is not running")
        if self._reserved >= self.max_queue:
            raise QueueFull
        self._reserved += 1
        self._unreserved.clear()
        return Reservation(self)

    async def encode(self, items: Sequence[PreparedItem], reservation: Reservation | None = None) -> list[torch.Tensor]:
        """Rows for each item, in order. Raises QueueFull (QueueBytesFull past the byte budget),
        WorkerStopped, TokenDrift or the model's error.

        Without a ``reservation`` (taken before preprocessing), one is taken now. A job alone in the
        queue is taken whatever its size: the budget bounds what waits beside others, not one request.
        """
        if not self.alive:
            raise WorkerStopped("the encoder worker is not running")
        reservation = reservation or self.reserve()
        job = _Job(items=items, future=asyncio.get_running_loop().create_future(), reservation=reservation)
        budget = self.max_queue_bytes
        if budget is not None and self._queued_bytes and self._queued_bytes + job.nbytes > budget:
            raise QueueBytesFull(self._queued_bytes, job.nbytes, budget)
        self._queued_bytes += job.nbytes
        self._queue.put_nowait(job)
        self._arrival.set()
        self._pending += 1
        return await job.future

    # ----- the loop -----
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._next_batch()
            if not batch:
                continue
            try:
                outcomes = await loop.run_in_executor(self._executor, self._encode_jobs, batch)
            except Exception as exc:  # the executor itself failed: fail this batch, keep serving
                logger.exception("encoder batch failed outside the model")
                outcomes = [exc] * len(batch)
            for job, outcome in zip(batch, outcomes, strict=True):
                self._done(job)
                if job.future.done():  # the request gave up (deadline or client gone)
                    continue
                if isinstance(outcome, BaseException):
                    job.future.set_exception(outcome)
                else:
                    job.future.set_result(outcome)

    async def _next_batch(self) -> list[_Job]:
        first = self._carry or await self._queue.get()
        self._carry = None
        batch = [first]
        items, tokens = len(first.items), first.tokens
        loop = asyncio.get_running_loop()
        try:
            # One timer for the whole batch; TimeoutError can only come from the wait below.
            async with asyncio.timeout_at(loop.time() + self.batch_wait_s):
                while items < self.max_batch_items and tokens < self.max_batch_tokens:
                    if self._queue.empty():
                        # Wait only for requests being decoded and preprocessed now (they hold
                        # reservations, as do the jobs of this batch): with none on their way, a lone
                        # request is not held back. Under load there always are, and a fuller batch
                        # spreads each forward's fixed cost (Python, dispatch) over more images: on a
                        # CPU shared with preprocessing, that is throughput.
                        if self._reserved <= len(batch):
                            break
                        self._arrival.clear()
                        await self._arrival.wait()
                        continue
                    job = self._queue.get_nowait()
                    if items + len(job.items) > self.max_batch_items or tokens + job.tokens > self.max_batch_tokens:
                        self._carry = job
                        break
                    batch.append(job)
                    items += len(job.items)
                    tokens += job.tokens
        except TimeoutError:
            pass  # the wait is over: run what has come
        for job in batch:
            job.reservation.release()  # out of the queue: its forward begins now
        # Requests that gave up while queued are dropped before any encoder work.
        live = [job for job in batch if not job.future.done()]
        for job in batch:
            if job.future.done():
                self._done(job)
        now = time.monotonic()
        for job in live:
            self.metrics.queue_wait_seconds.observe(now - job.enqueued_at)
        return live

    def _unreserve(self) -> None:
        self._reserved -= 1
        self._arrival.set()  # a request being preprocessed failed, or a batch took its jobs
        if not self._reserved:
            self._unreserved.set()

    def _done(self, job: _Job) -> None:
        self._pending -= 1
        self._queued_bytes -= job.nbytes
        self._queue.task_done()

    # ----- in the encoder thread -----
    def _encode_jobs(self, jobs: Sequence[_Job]) -> list[_Outcome]:
        items = [item for job in jobs for item in job.items]
        try:
            output = self._forward(items)
        except Exception as exc:
            if len(jobs) > 1:
                logger.warning("batch of %d requests failed (%r); re-running them apart", len(jobs), exc)
                return [self._encode_jobs([job])[0] for job in jobs]
            logger.exception("encoder forward failed for a request of %d items", len(items))
            return [exc]

        expected = [item.num_tokens for item in items]
        produced = output.rows_per_item
        if produced is not None and sum(produced) != output.rows.shape[0]:
            produced = None  # the layout does not add up: trust only the total
        if produced is None and output.rows.shape[0] != sum(expected):
            if len(jobs) > 1:
                return [self._encode_jobs([job])[0] for job in jobs]
            total = int(output.rows.shape[0])
            per_item = [total] if len(items) == 1 else self._rows_item_by_item(items)
            return [TokenDrift(expected, total, per_item)]

        counts = produced if produced is not None else expected
        # Copies, not views: a cached item must not pin the whole batch's output in memory.
        rows = [chunk.clone() for chunk in torch.split(output.rows, counts)]
        outcomes: list[_Outcome] = []
        start = 0
        for job in jobs:
            end = start + len(job.items)
            if expected[start:end] != counts[start:end]:
                outcomes.append(TokenDrift(expected[start:end], sum(counts[start:end]), counts[start:end]))
            else:
                outcomes.append(rows[start:end])
            start = end
        return outcomes

    def _forward(self, items: Sequence[PreparedItem]) -> EncoderOutput:
        with self.gate.exclusive():
            started = time.perf_counter()
            output = self.adapter.forward(items)
            self.metrics.encoder_seconds.observe(time.perf_counter() - started)
        self.metrics.batch_items.observe(len(items))
        self.metrics.batch_tokens.observe(int(output.rows.shape[0]))
        return output

    def _rows_item_by_item(self, items: Sequence[PreparedItem]) -> list[int] | None:
        """Observed rows per item of a drifting packed job: run each alone (error path only)."""
        try:
            return [int(self._forward([item]).rows.shape[0]) for item in items]
        except Exception:
            return None
