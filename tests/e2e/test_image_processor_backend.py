"""``--image-processor-backend``: the rows come from the image processor the LLM server would run.

transformers (and vLLM) preprocess with the torchvision processor whenever it imports; ``auto`` must do
the same, ``pil`` must give the PIL processor's rows, and the two must never share a content hash.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import Qwen2VLImageProcessor, Qwen2VLImageProcessorPil

from mmencode.models import load_encoder
from tests.helpers import data_uri, live_server, noise_image, rows_of

IMAGE = noise_image(211, 97, seed=41)  # not a multiple of the 28-pixel grid: both resample


def _encode_and_describe(checkpoint: Path, cache_dir: Path, backend: str) -> tuple[dict[str, Any], dict[str, Any]]:
    with (
        live_server(model=checkpoint, cache_dir=cache_dir, image_processor_backend=backend) as server,
        server.client() as client,
    ):
        response = client.post("/v1/encode", json={"items": [{"image": data_uri(IMAGE)}]})
        assert response.status_code == 200, response.text
        described = {
            "models": client.get("/v1/models").json()["data"][0]["image_processor_backend"],
            "ready": client.get("/ready").json()["image_processor_backend"],
        }
    return response.json()["items"][0], described


@pytest.fixture(scope="module")
def answers(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    cache_dir = tmp_path_factory.mktemp("cache")
    return {
        backend: _encode_and_describe(checkpoints["qwen2_vl"], cache_dir, backend)
        for backend in ("auto", "pil", "torchvision")
    }


def test_auto_chooses_torchvision_where_it_imports_as_transformers_does(answers: dict[str, Any]) -> None:
    auto, described = answers["auto"]
    assert described == {"models": "torchvision", "ready": "torchvision"}
    torchvision, _ = answers["torchvision"]
    assert auto["hash"] == torchvision["hash"]
    assert torch.equal(rows_of(auto), rows_of(torchvision))


def test_each_backend_gives_its_own_processors_rows_and_its_own_hash(
    answers: dict[str, Any], checkpoints: dict[str, Path]
) -> None:
    pil, described = answers["pil"]
    torchvision, _ = answers["torchvision"]
    assert described == {"models": "pil", "ready": "pil"}
    assert pil["hash"] != torchvision["hash"]
    assert pil["metadata"] == torchvision["metadata"]  # the same grid: only the pixel values differ
    for item, processor_class, backend in (
        (pil, Qwen2VLImageProcessorPil, "pil"),
        (torchvision, Qwen2VLImageProcessor, "torchvision"),
    ):
        adapter = load_encoder(
            checkpoints["qwen2_vl"], device=torch.device("cpu"), dtype=torch.float32, image_processor_backend=backend
        )
        assert type(adapter.processor) is processor_class
        inputs = adapter.processor(images=[IMAGE], return_tensors="pt")
        with torch.inference_mode():
            expected = adapter.module(hidden_states=inputs["pixel_values"], grid_thw=inputs["image_grid_thw"])
        assert torch.equal(rows_of(item), expected.pooler_output)
    # The control: the two processors really differ on this image, so the hashes must.
    assert not torch.equal(rows_of(pil), rows_of(torchvision))
