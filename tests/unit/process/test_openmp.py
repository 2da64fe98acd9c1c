"""``mmencode serve``'s OpenMP threads stop spinning soon after a forward (app/process/openmp.py).

Measured in fresh interpreters, since libgomp reads its spin count once, when torch loads it: a parallel
op on two threads, then a sleep, ten times; the process's CPU time during the sleeps is the team spinning.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mmencode.app.process.openmp import shorten_openmp_spin

_SPIN_AFTER_A_PARALLEL_OP = """
import time
from mmencode.app.process.openmp import shorten_openmp_spin
shorten_openmp_spin()
import torch
torch.set_num_threads(2)
x = torch.rand(4_000_000)
x.exp()
idle_cpu = 0.0
for _ in range(10):
    x.exp()  # one parallel region over both threads, as each op of a forward is
    before = time.process_time()
    time.sleep(0.05)
    idle_cpu += time.process_time() - before
print(idle_cpu)
"""


def _cpu_while_idle(**environ: str) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")} | environ
    result = subprocess.run(
        [sys.executable, "-c", _SPIN_AFTER_A_PARALLEL_OP], env=env, capture_output=True, text=True, check=True
    )
    return float(result.stdout)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="an OpenMP team needs two cores")
def test_the_team_sleeps_within_milliseconds_after_a_parallel_op_and_an_operators_count_stays() -> None:
    # libgomp's own default spins ~10 ms on this project's CI cores after every region (90-120 ms over
    # the ten sleeps, idle or beside six busy processes); ours, under a millisecond each (4-16 ms).
    assert _cpu_while_idle() < 0.04
    # A count the operator set is kept: a long one spins through the sleeps (~0.5 s of CPU; less when
    # other tests share the cores, hence the margin).
    assert _cpu_while_idle(GOMP_SPINCOUNT="1000000000") > 0.1


def test_nothing_is_set_once_torch_is_loaded() -> None:
    # This process has torch (and libgomp) loaded: a count set now would never be read.
    environ: dict[str, str] = {}
    assert not shorten_openmp_spin(environ)
    assert environ == {}


def test_the_cli_reaches_serve_before_torch_is_loaded() -> None:
    # serve() sets the count first thing; an import of torch on the way there would make it a no-op.
    code = (
        "import sys\n"
        "import mmencode.app.cli\n"
        "from mmencode.app.config import Settings\n"
        "Settings()\n"
        "print('torch' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
