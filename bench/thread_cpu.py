"""Where a CPU service's cores go: each server thread's CPU time and context switches under load (Linux).

    python -m bench.thread_cpu --checkpoint mid --requests 96 --concurrency 32

Drives ``mmencode serve`` (cache off) like the bench's service phase and reads ``/proc/PID/task`` before
and after. A forward that runs on every core shows as that many threads each busy for about the
encoder's time, with few voluntary context switches: threads that sleep at the forward's barriers
instead (thousands of switches, CPU well under the encoder's time) are waiting on each other, which is
how idle OpenMP teams in other threads showed up (app/engine/threads.py, bench/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.bench import warm_service
from bench.checkpoints import build_checkpoint
from bench.client import data_uri
from bench.common import drive, encoded_images
from bench.server_times import ServerTimes

_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ThreadUsage:
    cpu_s: float
    voluntary_switches: int
    involuntary_switches: int


def thread_usage(pid: int) -> dict[int, ThreadUsage]:
    """CPU seconds and context switches of each live thread of ``pid``, by thread id."""
    usage = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except FileNotFoundError:  # the thread ended between the listing and the read
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
        counters = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        usage[int(tid)] = ThreadUsage(
            cpu_s=(int(fields[11]) + int(fields[12])) / _TICKS,  # utime + stime
            voluntary_switches=int(counters["voluntary_ctxt_switches"]),
            involuntary_switches=int(counters["nonvoluntary_ctxt_switches"]),
        )
    return usage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default="mid", help="tiny, mid, or a checkpoint directory")
    parser.add_argument("--root", type=Path, default=Path(".cache/bench"))
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--image-size", default="392x392")
    parser.add_argument("--image-format", default="png", choices=["jpeg", "png"])
    parser.add_argument("serve_args", nargs="*", help="more `mmencode serve` options, after --")
    args = parser.parse_args()

    checkpoint = build_checkpoint(args.checkpoint, args.root) if "/" not in args.checkpoint else Path(args.checkpoint)
    width, height = (int(v) for v in args.image_size.split("x"))
    images = encoded_images(args.requests, width, height, image_format=args.image_format)
    bodies = [{"items": [{"image": data_uri(image, f"image/{args.image_format}")}]} for image in images]
    with warm_service(checkpoint, bodies, args.concurrency, *args.serve_args) as (url, process):
        pid = process.pid
        metrics_before, threads_before = httpx.get(url + "/metrics").text, thread_usage(pid)
        own_before = resource.getrusage(resource.RUSAGE_SELF)
        started = time.perf_counter()
        result = asyncio.run(drive(url, "/v1/encode", bodies, args.concurrency))
        wall = time.perf_counter() - started
        own_after = resource.getrusage(resource.RUSAGE_SELF)
        threads_after = thread_usage(pid)
        times = ServerTimes.between(metrics_before, httpx.get(url + "/metrics").text)

    images_done = result.images
    print(
        f"{images_done} images in {wall:.2f} s ({images_done / wall:.2f} img/s); encoder busy "
        f"{times.encoder_s_total / wall:.3f}, forward {times.encoder_s_total / images_done * 1000:.1f} ms per image, "
        f"{times.images_per_forward:.2f} images per forward"
    )
    print("thread    cpu s  ms/img  voluntary  involuntary switches")
    rows = []
    for tid, after in threads_after.items():
        before = threads_before.get(tid, ThreadUsage(0.0, 0, 0))
        cpu = after.cpu_s - before.cpu_s
        switches = (
            after.voluntary_switches - before.voluntary_switches,
            after.involuntary_switches - before.involuntary_switches,
        )
        if cpu > 0 or sum(switches):
            rows.append((cpu, tid, switches))
    for cpu, tid, (voluntary, involuntary) in sorted(rows, reverse=True):
        label = f"{tid} (main)" if tid == pid else str(tid)
        print(f"{label:>14} {cpu:6.2f} {cpu / images_done * 1000:7.1f} {voluntary:10d} {involuntary:12d}")
    load_generator = (own_after.ru_utime + own_after.ru_stime) - (own_before.ru_utime + own_before.ru_stime)
    server = sum(cpu for cpu, _, _ in rows)
    cores = os.cpu_count() or 1
    print(
        f"server {server:.2f} cpu s of {cores * wall:.2f} core-s; load generator {load_generator:.2f} cpu s "
        f"({load_generator / images_done * 1000:.1f} ms per image)"
    )


if __name__ == "__main__":
    main()
