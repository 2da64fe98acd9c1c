"""The README's curl examples, run as written against a live server."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import LiveServer, image_bytes, live_server, noise_image

README = Path(__file__).resolve().parents[2] / "README.md"


def _curl_commands() -> list[str]:
    section = README.read_text().split("## Using it", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None
    commands = block.group(1).replace("\\\n", "").splitlines()
    return [line.strip() for line in commands if line.strip().startswith("curl")]


@pytest.fixture(scope="module")
def readme_server(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    # The README talks to the default served name.
    with live_server(
        model=checkpoints["qwen2_vl"], served_model_name="qwen2_vl-tiny-v1", cache_dir=tmp_path_factory.mktemp("c")
    ) as server:
        yield server


def test_readme_has_the_examples_the_issue_asks_for() -> None:
    joined = "\n".join(_curl_commands())
    for needle in ("-F image=@cat.jpg", "/v1/encode -H", "/v1/embeddings", "/ready", "/metrics", "/v1/models"):
        assert needle in joined


@pytest.mark.parametrize("command", _curl_commands())
def test_readme_curl_example_works(command: str, readme_server: LiveServer, tmp_path: Path) -> None:
    (tmp_path / "cat.jpg").write_bytes(image_bytes(noise_image(120, 90, seed=51), "JPEG"))
    (tmp_path / "dog.png").write_bytes(image_bytes(noise_image(60, 100, seed=52)))
    command = command.replace("localhost:8000", readme_server.url.removeprefix("http://"))
    result = subprocess.run(
        ["bash", "-c", command.replace("curl -s", "curl -s --fail-with-body")],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    if command.endswith("/metrics"):
        assert "mmencode_requests_total" in result.stdout
        return
    body = json.loads(result.stdout)
    assert "error" not in body
    if "/v1/encode" in command:
        assert all(item["num_tokens"] == item["embedding"]["shape"][0] for item in body["items"])
        assert len(body["items"]) == (2 if "-F" in command else 1)
    if "/v1/embeddings" in command:
        assert len(body["data"][0]["embedding"]) == 64
