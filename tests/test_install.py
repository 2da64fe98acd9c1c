"""What `make` installs on a machine without a GPU: never PyPI's CUDA build of torch."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_fresh_venv_gets_torch_from_a_local_wheel_or_the_cpu_only_index(tmp_path: Path) -> None:
    dry_run = subprocess.run(
        ["make", "-n", f"VENV={tmp_path / 'venv'}", f"{tmp_path / 'venv'}/.installed"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    script = dry_run.stdout.replace("\\\n", " ")
    torch_line = next(line for line in script.splitlines() if "torch==" in line)
    # Tried in order: torch already there; a local wheel (no index, no deps); PyTorch's CPU-only index.
    assert torch_line.index('"import torch"') < torch_line.index("--no-index --no-deps")
    assert torch_line.index("--no-index --no-deps") < torch_line.index(
        "--index-url https://download.pytorch.org/whl/cpu"
    )
    assert 'torch==2.13.0"' in torch_line
    # The project's own install comes after torch, so its torch range is already satisfied.
    assert script.index("torch==") < script.index('pip install --quiet -e ".[test]"')


def test_the_gpu_index_is_one_variable_away(tmp_path: Path) -> None:
    gpu_index = "https://download.pytorch.org/whl/cu128"
    dry_run = subprocess.run(
        ["make", "-n", f"VENV={tmp_path / 'venv'}", f"TORCH_INDEX={gpu_index}", f"{tmp_path / 'venv'}/.installed"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert f"--index-url {gpu_index}" in dry_run.stdout
