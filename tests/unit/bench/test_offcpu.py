"""bench.offcpu charges each thread's time off the CPU to what it blocked in, from perf's sched_switch stacks."""

from __future__ import annotations

import pytest

from bench.offcpu import off_cpu_by_reason, parse_perf_script, thread_role


def switch(tid: int, time: float, state: str, next_tid: int) -> str:
    """A sched_switch header line as perf prints it."""
    return (
        f"{tid:>5} {time:12.6f}: sched:sched_switch: prev_comm=python prev_pid={tid} prev_prio=120 "
        f"prev_state={state} ==> next_comm=python next_pid={next_tid} next_prio=120"
    )


# `perf script --no-inline -F tid,time,event,trace,ip,sym` as it prints sched_switch events with user
# stacks (kernel frames first, innermost first), trimmed; thread 11 is an event loop, 12 a
# preprocessing thread, 99 perf's own `sleep`.
PERF_SCRIPT = f"""\
'trace' not valid for hardware events. Ignoring.
{switch(11, 1.000000, "S", 12)}
\tffffffff82248208 __schedule
\tffffffff8223cb30 do_syscall_64
\t          11e4a5 epoll_wait
\t           6a1f0 uv__io_poll
\t           64c2d uv_run

{switch(12, 1.004000, "S", 11)}
\tffffffff82248208 __schedule
\t           87ebf ___pthread_cond_timedwait
\t          24f8a1 take_gil
\t          24fdc1 PyEval_RestoreThread
\t           89e4b ImagingResample

{switch(11, 1.010000, "R", 12)}
\tffffffff82248208 __schedule
\tffffffff81424641 exit_to_user_mode_loop
\t           64c2d uv_run

{switch(12, 1.011000, "S", 99)}
\tffffffff82248208 __schedule
\t           7a2b1 _queue_SimpleQueue_get
{switch(99, 1.012000, "S", 11)}
\tffffffff82248208 __schedule
"""


def test_each_wait_is_charged_to_what_the_thread_blocked_in_until_it_ran_again() -> None:
    events = list(parse_perf_script(PERF_SCRIPT.splitlines()))
    assert [(e.tid, e.next_tid, e.runnable) for e in events] == [
        (11, 12, False), (12, 11, False), (11, 12, True), (12, 99, False), (99, 11, False),
    ]  # fmt: skip
    assert events[1].frames[-3:] == ["take_gil", "PyEval_RestoreThread", "ImagingResample"]

    totals = off_cpu_by_reason(events, tids={11, 12})
    assert set(totals) == {11, 12}  # perf's own sleep is not the server's
    assert totals[11]["event loop poll"] == pytest.approx(0.004)  # out at 1.000, back at 1.004
    assert totals[11]["preempted"] == pytest.approx(0.002)  # runnable at 1.010, back at 1.012
    assert totals[12]["GIL"] == pytest.approx(0.006)  # blocked in take_gil at 1.004, back at 1.010
    assert "no work queued" not in totals[12]  # it left at 1.011 and had not run again when perf stopped


def test_threads_are_named_by_what_their_stacks_show() -> None:
    frames: dict[int, list[str]] = {}
    for event in parse_perf_script(PERF_SCRIPT.splitlines()):
        frames.setdefault(event.tid, []).extend(event.frames)
    assert thread_role(frames[11]) == "event loop"
    assert thread_role(frames[12]) == "image preprocessing"
    assert thread_role(["THPVariable_linear", "take_gil"]) == "encoder"
    assert thread_role(["THPVariable_linear", "ImagingJpegDecode"]) == "image preprocessing"
