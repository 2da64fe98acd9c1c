"""What `pip install ".[video,audio]"` brings, and nothing else: mmencode serves video and audio items, with
the torchvision image processor the LLM servers use (.venv-plain, `make plain-env`)."""

from __future__ import annotations

from pathlib import Path

import httpx

from mmencode.models.tiny import build_tiny
from tests.helpers import audio_data_uri, clip, mmencode_process, plain_mmencode, tone, video_data_uri, wav


def test_a_plain_install_encodes_video_on_qwen2_vl_with_torchvision(tmp_path: Path) -> None:
    checkpoint = build_tiny(tmp_path / "qwen2_vl", "qwen2_vl")
    with mmencode_process(plain_mmencode(), "--model", str(checkpoint), log=tmp_path / "serve.log") as url:
        video = {"video": video_data_uri(clip(8, 64, 48, fps=4, seed=2)), "fps": 2}
        response = httpx.post(url + "/v1/encode", json={"items": [video]}, timeout=120)
        models = httpx.get(url + "/v1/models", timeout=10).json()["data"]
    assert response.status_code == 200, response.text
    item = response.json()["items"][0]
    assert item["num_tokens"] > 0 and "video_grid_thw" in item["metadata"]
    assert models[-1]["image_processor_backend"] == "torchvision"


def test_a_plain_install_encodes_audio_on_qwen2_audio(tmp_path: Path) -> None:
    checkpoint = build_tiny(tmp_path / "qwen2_audio", "qwen2_audio")
    with mmencode_process(plain_mmencode(), "--model", str(checkpoint), log=tmp_path / "serve.log") as url:
        audio = {"audio": audio_data_uri(wav(tone(1.5, 16_000), 16_000))}
        response = httpx.post(url + "/v1/encode", json={"items": [audio]}, timeout=120)
    assert response.status_code == 200, response.text
    assert response.json()["items"][0]["num_tokens"] > 0
