"""glibc's malloc, set for a process whose CPU forwards allocate and free large blocks (``mmencode serve``).

torch's CPU tensors come from the C library's malloc. glibc serves a block above its mmap threshold from
a mapping of its own and unmaps it when it is freed; the threshold moves with what is freed (32 MiB at
most), and the heap's free top goes back to the OS once it is past twice the threshold. A forward
allocates and frees its activations, megabytes each, layer after layer, so memory went back to the OS
and came again on every forward, each page zero-filled by the kernel on first touch: on the mid tower
5-18 % of a bare forward loop's time was system time, and a forward took 134-174 ms per image against
111-156 ms with the settings below, in turns (bench/README.md, "Allocator").

Fixed thresholds keep those blocks in the heap, reused from one forward to the next: a mapping of its
own only above 32 MiB (glibc's largest threshold), and up to 1 GiB of free heap top kept. The cost is
resident memory: what the largest forward freed stays mapped, instead of going back to the OS.

Only glibc has ``mallopt``; elsewhere (musl, macOS, an allocator preloaded in glibc's place) nothing
changes. Thresholds the operator set (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` or their
``GLIBC_TUNABLES``) are left as they are.
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "keep_large_blocks_in_heap"]

# mallopt's parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 32 << 20  # glibc refuses more on 64-bit
TRIM_THRESHOLD = 1 << 30

_OPERATOR_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
_OPERATOR_TUNABLES = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold")


def keep_large_blocks_in_heap() -> bool:
    """Set glibc's mmap and trim thresholds for this process (module docstring); True where glibc took them."""
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
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
