"""glibc's malloc under ``mmencode serve``: a forward's freed blocks are reused, not faulted in again."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from mmencode.app.malloc_tuning import keep_large_blocks_in_heap

ROOT = Path(__file__).resolve().parents[1]

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")

# Sixteen 6 MiB activations written and freed, as a forward's layers do (96 MiB: more free heap top than
# glibc keeps on its own, twice its largest threshold), sixty times over; prints the page faults the
# sixty cost, after one round that maps the heap the first time.
_FORWARD_LIKE = """
import resource, sys
import torch
from mmencode.app.malloc_tuning import keep_large_blocks_in_heap
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


def _page_faults(mode: str) -> int:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    result = subprocess.run(
        [sys.executable, "-c", _FORWARD_LIKE, mode], capture_output=True, text=True, cwd=ROOT, env=environment
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


@pytest.mark.parametrize(
    "setting",
    [
        {"MALLOC_MMAP_THRESHOLD_": "131072"},
        {"MALLOC_TRIM_THRESHOLD_": "131072"},
        {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"},
    ],
)
def test_thresholds_the_operator_set_are_left_alone(setting: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in setting.items():
        monkeypatch.setenv(name, value)
    assert keep_large_blocks_in_heap() is False
