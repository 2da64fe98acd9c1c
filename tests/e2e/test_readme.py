"""The README's examples, run as written against a live server, on photos of a real size.

A JPEG over 1 MB and a PNG over 500 KB: their base64 is larger than one command-line argument may be
(128 KiB on Linux), which is what broke the first README's `-d '...'"$(base64 ...)"'` examples.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.helpers import LiveServer, live_server

README = Path(__file__).resolve().parents[2] / "README.md"


def _using_it() -> str:
    return README.read_text().split("## The first ten minutes", 1)[1].split("\n## ", 1)[0]


def _shell_commands() -> list[str]:
    """Each command of the section's bash block: continuation lines and `{ ...; }` groups joined."""
    block = re.search(r"```bash\n(.*?)```", _using_it(), re.S)
    assert block is not None
    commands: list[str] = []
    current = ""
    for line in block.group(1).splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line + "\n"
        open_group = current.lstrip().startswith("{") and "; }" not in current
        if not line.endswith("\\") and not open_group:
            commands.append(current.strip())
            current = ""
    assert not current, f"unterminated command: {current}"
    return commands


def _python_example() -> str:
    block = re.search(r"```python\n(.*?)```", _using_it(), re.S)
    assert block is not None
    return block.group(1)


def _photo(width: int, height: int, seed: int) -> Image.Image:
    """Smooth gradients with sensor-like noise: compresses like a photo, not like a flat test card."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x / width * 255, y / height * 255, (x + y) / (width + height) * 255], axis=-1)
    noisy = base + rng.normal(0, 40, base.shape)
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8), "RGB")


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("photos")
    _photo(2000, 1500, seed=51).save(directory / "cat.jpg", "JPEG", quality=92)
    _photo(480, 400, seed=52).save(directory / "dog.png", "PNG")
    assert (directory / "cat.jpg").stat().st_size >= 1_000_000
    assert (directory / "dog.png").stat().st_size >= 500_000
    return directory


@pytest.fixture(scope="module")
def readme_server(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    # The README talks to the default served name.
    with live_server(
        model=checkpoints["qwen2_vl"], served_model_name="qwen2_vl-tiny-v1", cache_dir=tmp_path_factory.mktemp("c")
    ) as server:
        yield server


def test_readme_has_the_examples_the_issue_asks_for() -> None:
    joined = "\n".join(_shell_commands())
    for needle in ("-F image=@cat.jpg", "/v1/encode -H", "/v1/embeddings", "/ready", "/metrics", "/v1/models"):
        assert needle in joined
    assert "$(base64" not in joined  # an image in one argument breaks past ~96 KB of file


@pytest.mark.parametrize("command", _shell_commands())
def test_readme_shell_example_works_on_real_size_photos(command: str, readme_server: LiveServer, photos: Path) -> None:
    command = command.replace("localhost:8000", readme_server.url.removeprefix("http://"))
    result = subprocess.run(
        ["bash", "-o", "pipefail", "-c", command.replace("curl -s", "curl -s --fail-with-body")],
        cwd=photos, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    if command.endswith("/metrics"):
        assert "mmencode_requests_total" in result.stdout
        return
    body = json.loads(result.stdout)
    assert "error" not in body
    if "/v1/encode" in command:
        assert all(item["num_tokens"] == item["embedding"]["shape"][0] > 0 for item in body["items"])
        assert len(body["items"]) == (2 if "-F" in command else 1)
    if "/v1/embeddings" in command:
        assert len(body["data"]) == 1 and len(body["data"][0]["embedding"]) == 64


def test_readme_python_example_works_on_a_real_size_photo(readme_server: LiveServer, photos: Path) -> None:
    code = _python_example().replace("http://localhost:8000", readme_server.url)
    result = subprocess.run([sys.executable, "-c", code], cwd=photos, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "64"
