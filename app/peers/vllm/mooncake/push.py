"""A push: items' rows into a vLLM ``ECMooncakeConnector`` consumer, reserved, written and completed.

What vLLM's own producer does (``worker.py``'s ``_reserve_remote_many``, ``_push_batch``,
``_notify_completions``), for one consumer and every tensor-parallel shard it lists:

1. ``reserve_batch`` on every shard: each item's ``transfer_id``, ``mm_hash`` (vLLM's identifier for
   the item: the part's ``uuid``, mmencode's hash), ``nbytes``, ``shape`` and torch ``dtype`` name
   (``nbytes`` must be ``prod(shape) * itemsize``; the consumer checks nothing else, so the rows must
   be exactly the ones vLLM will place: mmencode's, checked against the processor's count);
2. a reservation that says ``write`` gets the rows, written by Mooncake at ``dst_ptr`` of
   ``dst_session``, one batch per session; one already ``ready`` or ``cached`` there (the consumer
   holds the item) needs nothing; one whose item another transfer is writing (neither) becomes ready
   when that one completes, which is waited for with ``status``;
3. ``complete_batch`` for what was written: the item is then the consumer's, for the request that
   names its ``transfer_id`` in ``ec_transfer_params``.

Whatever goes wrong (a refusal, no answer, a failed write, a reservation gone by completion, the whole
push past ``timeout_s``, or the caller cancelled) cancels every reservation made (``abandon``), and
the caller gets :class:`EncoderCachePushFailed`: a request that needs the rows must not be sent. A
cancel waits for writes still under way first: a destination freed while Mooncake writes into it
would be written over another item's rows.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any

import torch

from mmencode.app.engine.threads import in_executor
from mmencode.app.metrics import Metrics
from mmencode.app.peers.vllm.mooncake.control import ControlChannel, ControlRefused, ControlUnreachable
from mmencode.app.peers.vllm.mooncake.errors import EncoderCachePushFailed
from mmencode.app.peers.vllm.mooncake.transfer import MooncakeTransfer

__all__ = ["MooncakePusher", "PushReceipt", "Transfer"]

logger = logging.getLogger("mmencode.mooncake")

# Longest a cancel waits for a write still under way before leaving the reservation to the consumer's
# lease (300 s in vLLM 0.32): cancelling it under the writer would free memory being written.
_WRITE_DRAIN_S = 60.0
_STATUS_POLL_S = (0.002, 0.05)  # first and longest wait between two `status` polls of a shared item


@dataclass(frozen=True, slots=True)
class Transfer:
    """One item to push: the id the chat request will name, the item's identifier, its rows."""

    transfer_id: str
    mm_hash: str
    rows: torch.Tensor


@dataclass(frozen=True, slots=True)
class _Reservation:
    shard: str  # the control address of the shard that holds it
    transfer_id: str
    reservation_id: str


@dataclass(frozen=True, slots=True)
class PushReceipt:
    """A completed push: every shard holds every item until a request takes it (or its lease ends)."""

    consumer: str
    transfer_ids: tuple[str, ...]
    nbytes: int  # bytes Mooncake wrote (0 when the consumer held every item already)
    seconds: float
    reservations: tuple[_Reservation, ...] = field(repr=False)


@dataclass
class _Attempt:
    """What a push has done so far, for the cancel that undoes it."""

    stage: str = "reserve"
    # Every (shard, transfer id) asked for, with its reservation id once known: a reservation whose
    # answer never came (cancelled, timed out) is cancelled by its transfer id alone.
    asked: dict[tuple[str, str], str] = field(default_factory=dict)
    writes: list[Future[None]] = field(default_factory=list)

    @property
    def reservations(self) -> list[_Reservation]:
        return [_Reservation(shard, transfer_id, known) for (shard, transfer_id), known in self.asked.items()]


@dataclass
class _Plan:
    """One shard's part of a push: the writes it asks for, the items another transfer is writing."""

    shard: str
    writes: list[tuple[str, int, torch.Tensor, _Reservation]] = field(default_factory=list)  # session, ptr
    shared: list[str] = field(default_factory=list)  # transfer ids that become ready with another's write


class MooncakePusher:
    def __init__(
        self,
        transfer: MooncakeTransfer,
        control: ControlChannel,
        metrics: Metrics,
        *,
        timeout_s: float,
        executor: Executor,
    ) -> None:
        self.transfer = transfer
        self.control = control
        self._metrics = metrics
        self.timeout_s = timeout_s
        self._executor = executor  # dtype conversions and Mooncake's blocking writes; shut down by aclose
        self._cleanups: set[asyncio.Task[None]] = set()

    async def push(self, consumer: str, transfers: Sequence[Transfer], dtype: torch.dtype) -> PushReceipt:
        """Push every transfer's rows, as ``dtype``, to every shard of ``consumer`` (``tcp://host:port``)."""
        started = time.perf_counter()
        attempt = _Attempt()
        try:
            async with asyncio.timeout(self.timeout_s):
                nbytes = await self._push(consumer, transfers, dtype, attempt)
        except asyncio.CancelledError:
            # The client left: nothing will ask for these rows.
            self._metrics.mooncake_pushes.labels("cancelled").inc()
            self._cancel_later(attempt.reservations, attempt.writes)
            raise
        except Exception as exc:
            self._cancel_later(attempt.reservations, attempt.writes)
            self.control.forget(consumer)
            refused = isinstance(exc, ControlRefused)
            self._metrics.mooncake_pushes.labels("refused" if refused else "failed").inc()
            raise self._failure(consumer, attempt.stage, exc) from None
        seconds = time.perf_counter() - started
        self._metrics.mooncake_pushes.labels("ok").inc()
        self._metrics.mooncake_push_bytes.inc(nbytes)
        self._metrics.mooncake_push_seconds.observe(seconds)
        return PushReceipt(
            consumer, tuple(t.transfer_id for t in transfers), nbytes, seconds, tuple(attempt.reservations)
        )

    def release(self, receipt: PushReceipt) -> None:
        """Cancel a completed push whose request was not sent after all (in the background)."""
        self._cancel_later(list(receipt.reservations), [])

    async def aclose(self) -> None:
        """Let the cancels under way finish (each bounded), then close the control sockets and the engine."""
        if self._cleanups:
            await asyncio.gather(*self._cleanups, return_exceptions=True)
        self.control.close()
        # No write may outlive the engine: wait for those under way (off the loop).
        await asyncio.to_thread(functools.partial(self._executor.shutdown, wait=True, cancel_futures=True))
        self.transfer.close()

    # ----- the steps -----
    async def _push(self, consumer: str, transfers: Sequence[Transfer], dtype: torch.dtype, attempt: _Attempt) -> int:
        if not transfers:
            return 0
        sources = await in_executor(self._executor, _as_sources, [t.rows for t in transfers], dtype)
        dtype_name = str(dtype).removeprefix("torch.")
        items = [
            {
                "transfer_id": t.transfer_id,
                "mm_hash": t.mm_hash,
                "nbytes": source.nbytes,
                "shape": list(source.shape),
                "dtype": dtype_name,
            }
            for t, source in zip(transfers, sources, strict=True)
        ]
        shards = await self.control.shards(consumer)
        outcomes = await asyncio.gather(
            *(self._reserve(shard, items, sources, attempt) for shard in shards), return_exceptions=True
        )
        plans = [outcome for outcome in outcomes if isinstance(outcome, _Plan)]
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome  # after every shard answered: all its reservations are known, for the cancel

        attempt.stage = "write"
        by_session: dict[str, list[tuple[int, torch.Tensor]]] = {}
        for plan in plans:
            for session, pointer, source, _ in plan.writes:
                by_session.setdefault(session, []).append((pointer, source))
        for session, writes in by_session.items():
            attempt.writes.append(
                self._executor.submit(self.transfer.write, session, [s for _, s in writes], [p for p, _ in writes])
            )
        await asyncio.gather(*(asyncio.wrap_future(write) for write in attempt.writes))

        attempt.stage = "complete"
        await asyncio.gather(*(self._complete(plan) for plan in plans if plan.writes))
        attempt.stage = "wait"
        await asyncio.gather(*(self._ready(plan.shard, transfer_id) for plan in plans for transfer_id in plan.shared))
        return sum(source.nbytes for writes in by_session.values() for _, source in writes)

    async def _reserve(
        self, shard: str, items: list[dict[str, Any]], sources: list[torch.Tensor], attempt: _Attempt
    ) -> _Plan:
        for item in items:
            attempt.asked[shard, item["transfer_id"]] = ""
        result = await self.control.request(shard, {"op": "reserve_batch", "items": items})
        answers = result.get("items") if isinstance(result, dict) else None
        if not isinstance(answers, list) or len(answers) != len(items):
            raise ControlUnreachable(f"{shard} answered reserve_batch without one answer per item")
        plan = _Plan(shard)
        refusals = []
        for item, source, answer in zip(items, sources, answers, strict=True):
            transfer_id = item["transfer_id"]
            if not answer.get("ok"):
                refusals.append(f"{transfer_id}: {answer.get('error')}")
                continue
            reserved = answer["result"]
            if reserved.get("cancelled"):
                refusals.append(f"{transfer_id}: cancelled on the consumer before this push")
                continue
            reservation = _Reservation(shard, transfer_id, str(reserved["reservation_id"]))
            attempt.asked[shard, transfer_id] = reservation.reservation_id
            if int(reserved["nbytes"]) != source.nbytes:
                refusals.append(f"{transfer_id}: reserved {reserved['nbytes']} bytes for {source.nbytes}")
            elif reserved.get("write") and not reserved.get("cached"):
                plan.writes.append((str(reserved["dst_session"]), int(reserved["dst_ptr"]), source, reservation))
            elif not (reserved.get("ready") or reserved.get("cached")):
                plan.shared.append(transfer_id)
        if refusals:
            raise ControlRefused(f"{shard} refused {'; '.join(refusals)}")
        return plan

    async def _complete(self, plan: _Plan) -> None:
        written = [reservation for _, _, _, reservation in plan.writes]
        result = await self.control.request(
            plan.shard,
            {
                "op": "complete_batch",
                "items": [{"transfer_id": r.transfer_id, "reservation_id": r.reservation_id} for r in written],
            },
        )
        answers = result.get("items") if isinstance(result, dict) else None
        if not isinstance(answers, list) or len(answers) != len(written):
            raise ControlUnreachable(f"{plan.shard} answered complete_batch without one answer per item")
        lost = [r.transfer_id for r, answer in zip(written, answers, strict=True) if not answer.get("completed")]
        if lost:
            raise ControlRefused(
                f"{plan.shard} no longer holds the reservations of {lost} (expired, cancelled, or a restarted consumer)"
            )

    async def _ready(self, shard: str, transfer_id: str) -> None:
        """Wait for an item another transfer writes (the same rows asked for twice) to be ready here."""
        pause = _STATUS_POLL_S[0]
        while True:
            status = await self.control.request(shard, {"op": "status", "transfer_id": transfer_id})
            if not isinstance(status, dict):
                raise ControlRefused(f"{shard} dropped {transfer_id} before the transfer writing its rows completed")
            if status.get("ready"):
                return
            await asyncio.sleep(pause)
            pause = min(pause * 2, _STATUS_POLL_S[1])

    # ----- undoing -----
    def _cancel_later(self, reservations: list[_Reservation], writes: list[Future[None]]) -> None:
        if not reservations:
            return
        task = asyncio.get_running_loop().create_task(self._cancel(list(reservations), list(writes)))
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def _cancel(self, reservations: list[_Reservation], writes: list[Future[None]]) -> None:
        if writes:
            _, running = await asyncio.wait([asyncio.wrap_future(w) for w in writes], timeout=_WRITE_DRAIN_S)
            if running:
                logger.error(
                    "a Mooncake write still runs after %g s; leaving %d reservations to the consumer's lease",
                    _WRITE_DRAIN_S,
                    len(reservations),
                )
                return
        results = await asyncio.gather(
            *(
                self.control.request(
                    r.shard,
                    {"op": "cancel", "transfer_id": r.transfer_id, "reservation_id": r.reservation_id, "abandon": True},
                )
                for r in reservations
            ),
            return_exceptions=True,
        )
        failed = [
            f"{r.shard} {r.transfer_id}: {e}"
            for r, e in zip(reservations, results, strict=True)
            if isinstance(e, BaseException)
        ]
        if failed:
            # A consumer that restarted took its reservations with it; one that is up frees them at lease end.
            logger.warning("could not cancel %d Mooncake reservations: %s", len(failed), "; ".join(failed))

    def _failure(self, consumer: str, stage: str, exc: BaseException) -> EncoderCachePushFailed:
        reason = (
            f"no answer within the push's {self.timeout_s:g} s (--mooncake-push-timeout)"
            if isinstance(exc, TimeoutError)
            else str(exc) or type(exc).__name__
        )
        logger.warning("Mooncake push to %s failed at %s: %s", consumer, stage, reason)
        return EncoderCachePushFailed(
            f"the rows could not be pushed to the vLLM consumer at {consumer} ({stage}: {reason}); the request "
            "was not sent",
            details={"consumer": consumer, "stage": stage, "reason": reason},
            headers={"Retry-After": "1"},
        )


def _as_sources(rows: list[torch.Tensor], dtype: torch.dtype) -> list[torch.Tensor]:
    """Each item's rows as the consumer's dtype, contiguous, in this process's memory."""
    return [r.detach().to(device="cpu", dtype=dtype).contiguous() for r in rows]
