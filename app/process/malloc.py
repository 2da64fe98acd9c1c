"""glibc's malloc, set for a process whose CPU forwards allocate and free large blocks (``mmencode serve``).

torch's CPU tensors come from the C library's malloc. glibc serves a block above its mmap threshold from
a mapping of its own and unmaps it when it is freed; the threshold moves with what is freed (32 MiB at
most), and the heap's free top goes back to the OS once it is past twice the threshold. A forward
allocates and frees its activations, megabytes each, layer after layer, so memory went back to the OS
and came again on every forward, each page zero-filled by the kernel on first touch: on the mid tower
5-18 % of a bare forward loop's time was system time, and a forward took 134-174 ms per image against
111-156 ms with the settings below, in turns (bench/README.md, "Allocator").

Fixed thresholds keep those blocks in the heap, reused from one forward to the next: a mapping of its
own only above 32 MiB (glibc's largest threshold), and up to 1 GiB of free heap top kept.

That holds for the main thread's heap. Every other thread (the service's encoder thread among them) gets
an arena of its own, made of 64 MiB heaps, and glibc unmaps such a heap as soon as every block in it is
free, whatever the trim threshold, unless the heap before it has less than the top pad free at its end.
Under load the encoder's arena also holds blocks that outlive a forward (answers not yet sent, cached
rows), so a forward's activations spill into a new heap that is unmapped when they are freed: ~3,500
page faults per image of the mid tower, its forward ~7 % slower (bench/README.md, "Allocator"). A top pad
of a whole heap's size keeps every heap. It also makes each new thread heap, and each growth of the main
one, map 64 MiB of address space at once: address space, not memory, until it is written.

The cost is resident memory: what the largest forward freed stays mapped, in whichever thread's heap,
instead of going back to the OS.

Only glibc has ``mallopt``; elsewhere (musl, macOS, an allocator preloaded in glibc's place) nothing
changes. Settings the operator made (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``,
``MALLOC_TOP_PAD_`` or their ``GLIBC_TUNABLES``) are left as they are, and nothing else is set then.
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["MMAP_THRESHOLD", "TOP_PAD", "TRIM_THRESHOLD", "keep_large_blocks_in_heap"]

# mallopt's parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 32 << 20  # glibc refuses more on 64-bit
TRIM_THRESHOLD = 1 << 30
TOP_PAD = 64 << 20  # a thread arena's heap size on 64-bit (twice the largest mmap threshold)

_OPERATOR_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
_OPERATOR_TUNABLES = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold", "glibc.malloc.top_pad")


def keep_large_blocks_in_heap() -> bool:
    """Set glibc's mmap and trim thresholds and its top pad for this process (module docstring); True where
    glibc took them."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if any(name in os.environ for name in _OPERATOR_VARIABLES) or any(t in tunables for t in _OPERATOR_TUNABLES):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # this process's symbols: the C library's, where it has one
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # The mmap threshold first: setting it also stops glibc from moving both thresholds on its own.
    settings = ((_M_MMAP_THRESHOLD, MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD), (_M_TOP_PAD, TOP_PAD))
    return all(mallopt(parameter, value) for parameter, value in settings)
