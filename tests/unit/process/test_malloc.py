"""glibc's malloc under ``mmencode serve``: a forward's freed blocks are reused, not faulted in again,
in the main thread's heap and in another thread's arena alike."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from mmencode.app.process.malloc import keep_large_blocks_in_heap

ROOT = Path(__file__).resolve().parents[3]

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")

# Sixteen 6 MiB activations written and freed, as a forward's layers do (96 MiB: more free heap top than
# glibc keeps on its own, twice its largest threshold), sixty times over; prints the page faults the
# sixty cost, after one round that maps the heap the first time.
_FORWARD_LIKE = """
import resource, sys
import torch
from mmencode.app.process.malloc import keep_large_blocks_in_heap
if sys.argv[1] == "tuned":
    assert keep_large_blocks_in_heap()
def forward_like():
    blocks = [torch.ones(3 << 19) for _ in range(16)]
    del blocks
forward_like()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(60):
    forward_like()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


# A thread other than the main one (as the service's encoder thread) with 56 MiB of its arena's 64 MiB heap
# held by blocks that outlive the loop (as answers not yet sent and cached rows hold part of the encoder's),
# then a 9 MiB activation written and freed sixty times: it no longer fits beside them, so glibc puts it in
# a heap of its own, which it unmaps as soon as the block is freed unless the top pad keeps it. Prints the
# page faults the sixty cost that thread.
_THREAD_HEAP_CHURN = """
import ctypes, resource, sys, threading
from mmencode.app.process.malloc import keep_large_blocks_in_heap
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
assert keep_large_blocks_in_heap()
if sys.argv[1] == "glibc-top-pad":
    assert libc.mallopt(-2, 128 * 1024)  # M_TOP_PAD back to glibc's default, the thresholds kept
def written(size):
    block = libc.malloc(size)
    libc.memset(block, 1, size)
    return block
def thread():
    kept = [written(8 << 20) for _ in range(7)]
    libc.free(written(9 << 20))
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    for _ in range(60):
        libc.free(written(9 << 20))
    print(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
worker = threading.Thread(target=thread)
worker.start()
worker.join()
"""


def _page_faults(mode: str, script: str = _FORWARD_LIKE) -> int:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    result = subprocess.run(
        [sys.executable, "-c", script, mode], capture_output=True, text=True, cwd=ROOT, env=environment
    )
    assert result.returncode == 0, result.stderr
    return int(result.stdout.strip())


@glibc_only
def test_freed_activations_are_reused_instead_of_faulted_in_again() -> None:
    # Tuned, the sixty rounds cost ~6-15k faults here, whatever the count of rounds: the blocks stay in the
    # heap. Untouched, 26k at best (when glibc's moving threshold settles early) and ~1.3M at worst (it gives
    # the 96 MiB back to the OS every round); a real forward loop paid 5-18 % of its time for them (bench/README.md).
    tuned = _page_faults("tuned")
    assert tuned < 20_000, tuned


@glibc_only
def test_a_threads_heaps_are_kept_when_its_blocks_are_freed() -> None:
    # A 9 MiB block is 2,304 pages: with glibc's own top pad each of the sixty rounds maps a new heap and
    # faults them all in (~138k here); with the service's, the heap made in the first round is reused.
    # In the service that was ~3,500 faults per image of the mid tower's forward (bench/README.md, "Allocator").
    assert _page_faults("glibc-top-pad", _THREAD_HEAP_CHURN) > 60_000
    assert _page_faults("tuned", _THREAD_HEAP_CHURN) < 2_304


@pytest.mark.parametrize(
    "setting",
    [
        {"MALLOC_MMAP_THRESHOLD_": "131072"},
        {"MALLOC_TRIM_THRESHOLD_": "131072"},
        {"MALLOC_TOP_PAD_": "131072"},
        {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"},
        {"GLIBC_TUNABLES": "glibc.malloc.top_pad=131072"},
    ],
)
def test_thresholds_the_operator_set_are_left_alone(setting: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in setting.items():
        monkeypatch.setenv(name, value)
    assert keep_large_blocks_in_heap() is False
