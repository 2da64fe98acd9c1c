"""``mmencode serve`` with no model: builds the embedded tiny checkpoint and serves it, as the README says."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from tests.helpers import data_uri, free_port, noise_image, wait_ready


def test_serve_with_no_arguments_serves_the_embedded_model(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "MMENCODE_PORT": str(port), "MMENCODE_CACHE_DIR": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "mmencode", "serve"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        wait_ready(f"http://127.0.0.1:{port}", timeout=120)
        response = httpx.post(
            f"http://127.0.0.1:{port}/v1/encode", json={"items": [{"image": data_uri(noise_image(56, 56))}]}
        )
        assert response.status_code == 200, response.text
        assert response.json()["model"] == "qwen2_vl-tiny-v1"
        assert (tmp_path / "models" / "qwen2_vl-tiny-v1" / "model.safetensors").is_file()
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    # uvicorn shuts down gracefully, then re-raises the signal it caught.
    assert process.returncode in (0, -signal.SIGTERM), output.decode()
    assert "Application shutdown complete" in output.decode()
    log = output.decode()
    assert "mmencode.access" in log and "POST /v1/encode 200 items=1 tokens=4" in log
    # A ready line once the model is loaded and warm, after uvicorn's own "startup complete".
    assert log.index("Application startup complete") < log.index("ready: serving qwen2_vl-tiny-v1")


def test_help_lists_every_option_with_its_environment_variable() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mmencode", "serve", "--help"], capture_output=True, text=True, check=True
    )
    for flag, env in [
        ("--max-queue", "MMENCODE_MAX_QUEUE"),
        ("--model", "MMENCODE_MODEL"),
        ("--dtype", "MMENCODE_DTYPE"),
    ]:
        assert flag in result.stdout and env in result.stdout
