"""How long torch's OpenMP threads spin after a parallel region: set before torch is imported.

torch's Linux wheels run their parallel ops on GNU OpenMP (libgomp). A thread of a forward's team that
has done its share waits for the next parallel region by spinning ``GOMP_SPINCOUNT`` times before it
sleeps; libgomp reads the count once, when it is loaded, and its default is 300,000 spins. Inside a
forward that is what keeps the team fast: the next op's region starts microseconds later. After the last
op it is ~11 ms of a core spent waiting for a forward that will not come before preprocessing has run, on
the cores preprocessing needs (app/engine/compute_gate.py): on two cores the mid tower's helper thread spun
through about half of every gap between forwards (bench/README.md, "OpenMP's spin after a forward").
20,000 spins (under a millisecond) still cover the waits inside a forward.

Only ``mmencode serve`` sets it, in its own process; a count or wait policy already in the environment
is the operator's and stays. Other OpenMP runtimes (Intel's ``KMP_BLOCKTIME``, LLVM's) have knobs of
their own, left alone.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

__all__ = ["SERVING_GOMP_SPINCOUNT", "shorten_openmp_spin"]

SERVING_GOMP_SPINCOUNT = 20_000


def shorten_openmp_spin(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Set ``GOMP_SPINCOUNT`` for this process's libgomp unless the operator chose a count or a wait
    policy, or torch (and with it libgomp) is loaded already, too late for it to be read. True if set."""
    if "GOMP_SPINCOUNT" in environ or "OMP_WAIT_POLICY" in environ or "torch" in sys.modules:
        return False
    environ["GOMP_SPINCOUNT"] = str(SERVING_GOMP_SPINCOUNT)
    return True
