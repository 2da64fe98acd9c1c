"""Why a CPU service leaves cores idle under load: each server thread's time off the CPU, by what it
waited on (Linux, perf).

    python -m bench.offcpu --image-processor-backend pil --concurrency 16

Drives ``mmencode serve`` (cache off) on ``bench.compare_infinity``'s tiny CLIP with fresh JPEGs while
``perf record -e sched:sched_switch`` takes the user stack of every thread each time it leaves a core,
for ``--seconds``. The time until the same thread runs again is charged to what it blocked in: the GIL
(``take_gil``), a queue that had no work, the event loop's poll, OpenMP's barrier, or a preemption (it
was runnable and lost its core). The machine's idle share over the window comes from ``/proc/stat``.
A core idle while work is queued and threads wait on the GIL is time the interpreter, not the CPU, is
costing (bench/README.md, "Where the PIL backend's last tenth goes"). Needs ``perf`` and the right to
trace the server (root here); ``perf script --no-inline`` reads the stacks in seconds, where resolving
inlined frames takes minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import tempfile
import threading
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench.bench import warm_service
from bench.client import data_uri
from bench.common import LoadResult, drive, jpeg_images
from bench.compare_infinity import clip_checkpoint

__all__ = ["SwitchOut", "off_cpu_by_reason", "parse_perf_script", "reason_of", "thread_role"]

_SWITCH = re.compile(
    r"^\s*(?P<tid>\d+)\s+(?P<time>[\d.]+): sched:sched_switch: .*prev_pid=(?P<prev>\d+) "
    r".*prev_state=(?P<state>\S+) ==> .*next_pid=(?P<next>\d+)"
)

# What a thread blocked in, by the first user-space frame that names it (innermost first).
_REASONS = (
    ("take_gil", "GIL"),
    ("gomp_", "OpenMP barrier"),
    ("epoll_", "event loop poll"),
    ("_queue_SimpleQueue_get", "no work queued"),
    ("PyThread_acquire_lock", "lock or condition"),
)
# What a thread is, by a frame seen anywhere in its stacks.
_ROLES = (
    ("uv_run", "event loop"),
    ("gomp_thread_start", "OpenMP worker"),
    ("ImagingJpegDecode", "image preprocessing"),  # before torch: preprocessing calls torch ops too
    ("ImagingResample", "image preprocessing"),
    ("THPVariable_", "encoder"),
)


@dataclass
class SwitchOut:
    """One ``sched_switch``: ``tid`` left its core at ``time``; ``next_tid`` took it."""

    time: float
    tid: int
    runnable: bool  # prev_state R: preempted, not blocked
    next_tid: int
    frames: list[str] = field(default_factory=list)  # symbols, innermost first


def parse_perf_script(lines: Iterable[str]) -> Iterator[SwitchOut]:
    """``perf script -F tid,time,event,trace,ip,sym`` output, one event per header line and its stack."""
    current: SwitchOut | None = None
    for line in lines:
        match = _SWITCH.match(line)
        if match:
            if current is not None:
                yield current
            current = SwitchOut(
                time=float(match["time"]),
                tid=int(match["prev"]),
                runnable=match["state"].startswith("R"),
                next_tid=int(match["next"]),
            )
        elif current is not None and line.startswith(("\t", " ")) and line.strip():
            parts = line.split(None, 1)  # address, then the symbol and its module
            if len(parts) == 2:
                current.frames.append(parts[1].split(" (", 1)[0])
    if current is not None:
        yield current


def reason_of(event: SwitchOut) -> str:
    if event.runnable:
        return "preempted"
    for marker, reason in _REASONS:
        if any(marker in frame for frame in event.frames):
            return reason
    return "other"


def thread_role(frames: Iterable[str]) -> str:
    seen = set(frames)
    for marker, role in _ROLES:
        if any(marker in frame for frame in seen):
            return role
    return "other"


def off_cpu_by_reason(events: Iterable[SwitchOut], tids: set[int]) -> dict[int, Counter[str]]:
    """Seconds each of ``tids`` spent off the CPU, by why it left: from each switch-out to its next switch-in."""
    away: dict[int, tuple[float, str]] = {}
    totals: dict[int, Counter[str]] = defaultdict(Counter)
    for event in events:
        if event.next_tid in away:
            left, reason = away.pop(event.next_tid)
            totals[event.next_tid][reason] += event.time - left
        if event.tid in tids:
            away[event.tid] = (event.time, reason_of(event))
    return dict(totals)


def _idle_share() -> tuple[int, int]:
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields), fields[3] + fields[4]  # all jiffies, idle + iowait


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path(".cache/bench"))
    parser.add_argument("--image-processor-backend", default="pil")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=1600, help="enough to outlast --seconds")
    parser.add_argument("--image-size", default="640x480")
    parser.add_argument("--seconds", type=float, default=3.0, help="how long perf records (its files grow fast)")
    args = parser.parse_args()
    if shutil.which("perf") is None:
        parser.error("needs perf (Debian: apt-get install linux-perf)")

    checkpoint = clip_checkpoint(args.root)
    width, height = (int(v) for v in args.image_size.split("x"))
    bodies = [{"items": [{"image": data_uri(jpeg)}]} for jpeg in jpeg_images(args.requests, width, height, seed=9)]
    backend = ("--image-processor-backend", args.image_processor_backend)
    with (
        warm_service(checkpoint, bodies, args.concurrency, *backend) as (url, process),
        tempfile.TemporaryDirectory() as tmp,
    ):
        data = Path(tmp) / "switches.data"
        record = [
            "perf", "record", "-q", "-e", "sched:sched_switch", "--call-graph", "dwarf,16384",
            "-o", str(data), "-p", str(process.pid), "--", "sleep", str(args.seconds),
        ]  # fmt: skip
        result: list[LoadResult] = []
        load = threading.Thread(
            target=lambda: result.append(asyncio.run(drive(url, "/v1/encode", bodies, args.concurrency)))
        )
        load.start()
        before = _idle_share()
        subprocess.run(record, check=True, stdout=subprocess.DEVNULL)
        after = _idle_share()
        load.join()
        tids = {int(task.name) for task in Path(f"/proc/{process.pid}/task").iterdir()}
        script = subprocess.run(
            ["perf", "script", "--no-inline", "-i", str(data), "-F", "tid,time,event,trace,ip,sym"],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
    events = list(parse_perf_script(script.stdout.splitlines()))
    totals = off_cpu_by_reason(events, tids)
    frames_of: dict[int, set[str]] = defaultdict(set)
    for event in events:
        frames_of[event.tid].update(event.frames)
    idle = (after[1] - before[1]) / max(1, after[0] - before[0])
    rate = result[0].images_per_s
    print(f"{rate:.1f} img/s over the load; the machine was idle {idle:.1%} of the {args.seconds} s perf recorded")
    print(f"{'thread':>8} {'role':<22} {'off-CPU s':>9}  by reason (s)")
    for tid, reasons in sorted(totals.items(), key=lambda item: -sum(item[1].values())):
        shares = ", ".join(f"{reason} {seconds:.3f}" for reason, seconds in reasons.most_common())
        print(f"{tid:>8} {thread_role(frames_of[tid]):<22} {sum(reasons.values()):>9.3f}  {shares}")
    gil = sum(reasons["GIL"] for reasons in totals.values())
    print(f"waiting for the GIL, all threads together: {gil:.3f} s in {args.seconds} s")


if __name__ == "__main__":
    main()
