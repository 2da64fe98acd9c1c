"""What `make` installs, and that mmencode installs beside the torch an LLM server brings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def _dry_run(tmp_path: Path, *variables: str) -> str:
    venv = tmp_path / "venv"
    dry_run = subprocess.run(
        ["make", "-n", f"VENV={venv}", *variables, f"{venv}/.installed"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    # One line per command, its words single-spaced.
    return "\n".join(" ".join(line.split()) for line in dry_run.stdout.replace("\\\n", " ").splitlines())


def test_a_fresh_venv_gets_the_torch_and_torchvision_pair_before_the_project(tmp_path: Path) -> None:
    script = _dry_run(tmp_path)
    pair = next(line for line in script.splitlines() if "torch==" in line)
    # A torch already there is kept; otherwise the pair that transformers' default processors need.
    assert pair.index('"import torch, torchvision"') < pair.index('"torch==2.14.1" "torchvision==0.29.1"')
    # Without an NVIDIA driver PyTorch's CPU index comes first, PyPI if it cannot be reached; said in one line.
    cpu = pair.index("--index-url https://download.pytorch.org/whl/cpu")
    assert pair.index("nvidia") < cpu < pair.rindex('pip install --quiet "torch==2.14.1"')
    assert "make: torch" in pair
    # The project's own install comes after, so its open torch range is already satisfied.
    assert script.index("torch==") < script.index('pip install --quiet -e ".[test]"')


def test_a_gpu_index_is_one_variable_away(tmp_path: Path) -> None:
    index = "https://download.pytorch.org/whl/cu128"
    script = _dry_run(tmp_path, f"TORCH_INDEX={index}")
    assert f'--index-url {index} "torch==2.14.1" "torchvision==0.29.1"' in script


def test_installing_mmencode_keeps_the_torch_already_there(tmp_path: Path) -> None:
    # This environment holds torch 2.14.1, the release vLLM 0.34 and SGLang 0.5.23 install. Offline, pip
    # must find every requirement already satisfied: a capped torch range would send it looking for another.
    assert torch.__version__.startswith("2.14.1"), torch.__version__
    report = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation", "--quiet",
         "--report", str(report), str(ROOT)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    installs = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
    assert installs == ["mmencode"], installs
