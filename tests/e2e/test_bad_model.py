"""``mmencode serve --model <something unservable>`` exits non-zero at once, with one clear line.

A process that stays up unready forever is invisible to a restart policy or a liveness probe.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from mmencode.models.tiny import build_tiny
from tests.helpers import free_port


def _serve(model: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MMENCODE_CACHE_DIR": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "mmencode", "serve", "--model", model, "--port", str(free_port())]
    # The timeout is the assertion that it exits by itself: a hanging server fails the test.
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=90)


def _no_weights(tmp_path: Path) -> Path:
    model = build_tiny(tmp_path / "no-weights", "siglip", layout="vision")
    (model / "model.safetensors").unlink()
    return model


def _unsupported(tmp_path: Path) -> Path:
    model = tmp_path / "llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return model


def _file(tmp_path: Path) -> Path:
    path = tmp_path / "weights.safetensors"
    path.write_bytes(b"")
    return path


CASES: dict[str, tuple[Callable[[Path], str], list[str]]] = {
    "hub id": (
        lambda _: "Qwen/Qwen2-VL-2B-Instruct",
        # The README's download line, include patterns and all.
        ['hf download Qwen/Qwen2-VL-2B-Instruct --include "*.json" "*.safetensors" --local-dir'],
    ),
    "missing directory": (lambda p: str(p / "nowhere"), ["does not exist", "save_pretrained"]),
    "a file": (lambda p: str(_file(p)), ["is a file"]),
    "unsupported model_type": (lambda p: str(_unsupported(p)), ["'llama'", "not supported", "qwen2_vl"]),
    "no weights": (lambda p: str(_no_weights(p)), ["no model.safetensors"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_unservable_model_exits_before_binding_the_port(case: str, tmp_path: Path) -> None:
    make_model, expected = CASES[case]
    result = _serve(make_model(tmp_path), tmp_path)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("mmencode: error:")]
    assert len(errors) == 1, result.stderr
    for needle in expected:
        assert needle in errors[0]
    assert "Traceback" not in result.stderr
    assert "Uvicorn running" not in result.stderr  # refused before the port was bound


def test_weights_that_do_not_fit_exit_non_zero_once_loading_finds_out(tmp_path: Path) -> None:
    # Files all present, so only loading can tell: the config asks for a wider tower than the weights.
    model = build_tiny(tmp_path / "misfit", "siglip", layout="vision")
    config = json.loads((model / "config.json").read_text())
    config["hidden_size"] = 48
    (model / "config.json").write_text(json.dumps(config))

    result = _serve(str(model), tmp_path)

    assert result.returncode == 1, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("mmencode: error: the model failed to load:") and "expects" in last, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("family", ["step3p7", "kimi_k25"])
def test_without_torchvision_serve_exits_with_one_clear_line(family: str, tiny_checkpoint: Callable[..., Path]) -> None:
    checkpoint = tiny_checkpoint(family)
    program = (
        "import sys; sys.modules['torchvision'] = None\n"
        "from app.cli import main\n"
        f"raise SystemExit(main(['serve', '--model', {str(checkpoint)!r}, '--port', '0']))"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"mmencode: error: model_type '{family}' needs torchvision (transformers implements "
        "its image processor only with torchvision), which is not importable here (ModuleNotFoundError: "
        "import of torchvision halted; None in sys.modules); install the matching pair, e.g. "
        "`pip install torch==2.14.1 torchvision==0.29.1`"
    ]
