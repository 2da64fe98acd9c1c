"""Runs the peers' own decoders (tests/peers/*.py) in the separate peers venv, from the main suite.

vLLM 0.34.0 and SGLang 0.5.23 are installed there with ``--no-deps`` beside the CPU torch, plus only
the small packages their decode paths import (``make peers``; ``make test`` builds it first).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
PEERS_PYTHON = ROOT / ".venv-peers" / "bin" / "python"
HERE = Path(__file__).resolve().parent


def peers_python() -> str:
    """The peers venv's python. Without it the test skips, naming the command that builds it; under CI
    (``CI`` set, as CI services set it), where ``make test`` builds it first, a missing venv fails."""
    if not PEERS_PYTHON.is_file():
        message = f"{PEERS_PYTHON} is missing: build it with `make peers` (make test does)"
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail(message)
        pytest.skip(message)
    return str(PEERS_PYTHON)


def _run(args: list[str], *, stdin: str | None = None, env: dict[str, str] | None = None) -> None:
    result = subprocess.run(
        [peers_python(), *args], input=stdin, capture_output=True, text=True, timeout=180,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]


def vllm_decode(payloads: list[str], tmp_path: Path, modality: str | list[str] = "image") -> list[torch.Tensor]:
    """``ImageEmbeddingMediaIO.load_base64`` (``VideoEmbeddingMediaIO``'s for videos) on each payload, in
    vLLM's own code. ``modality``: one for all payloads, or one per payload (a single start of vLLM)."""
    out = tmp_path / "vllm_decoded.pt"
    modalities = modality if isinstance(modality, str) else ",".join(modality)
    _run([str(HERE / "vllm_decode.py"), str(out), modalities], stdin=json.dumps(payloads))
    decoded: list[torch.Tensor] = torch.load(out, weights_only=True)
    return decoded


def vllm_ec_consume(storage: Path, hashes: list[str], tmp_path: Path) -> dict[str, Any]:
    """What vLLM's ``ECExampleConnector`` in the consumer role finds and loads from ``storage``."""
    out = tmp_path / "vllm_ec.pt"
    _run([str(HERE / "vllm_ec_consumer.py"), str(storage), str(out), *hashes], env={"VLLM_TARGET_DEVICE": "cpu"})
    consumed: dict[str, Any] = torch.load(out, weights_only=True)
    return consumed


class SGLangReceiver:
    """A ZMQ PULL socket on loopback in the peers venv, decoding with SGLang's code (sglang_receive.py)."""

    def __init__(self, tmp_path: Path, count: int, name: str = "sglang", timeout_s: float = 60) -> None:
        self.out = tmp_path / f"{name}.pt"
        self.process = subprocess.Popen(
            [peers_python(), str(HERE / "sglang_receive.py"), str(self.out), str(count), str(timeout_s)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.strip().isdigit():
            self.process.kill()
            raise AssertionError(f"the SGLang receiver did not start: {line} {self.process.stderr.read()[-4000:]}")  # type: ignore[union-attr]
        self.port = int(line)

    def messages(self) -> list[dict[str, Any]]:
        _, stderr = self.process.communicate(timeout=120)
        assert self.process.returncode == 0, stderr[-4000:]
        decoded: dict[str, Any] = torch.load(self.out, weights_only=True)
        return list(decoded["messages"])

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def sglang_preprocess_video(cases: list[dict[str, Any]], tmp_path: Path) -> list[dict[str, Any]]:
    """SGLang's ``preprocess_video`` on each case (sglang_video.py says what a case is), in the vLLM
    oracle's Python with the peers venv's sglang on its path: SGLang's video code needs torchvision, which
    only that environment has (beside the CPU torch, through its documented shim)."""
    from bench.peers.vllm.server import vllm_executable  # skips, or fails under CI, without .venv-vllm

    python = vllm_executable().parent / "python"
    (site_packages,) = (Path(peers_python()).parent.parent / "lib").glob("python3*/site-packages")
    cases_file, out = tmp_path / "sglang_video_cases.pt", tmp_path / "sglang_video.pt"
    torch.save(cases, cases_file)
    result = subprocess.run(
        [str(python), str(HERE / "sglang_video.py"), str(site_packages), str(cases_file), str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    answers: list[dict[str, Any]] = torch.load(out, weights_only=True)
    return answers
