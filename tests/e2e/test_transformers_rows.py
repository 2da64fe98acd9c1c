"""Rows served over HTTP are transformers' own rows: its processor of the backend asked and its tower,
nothing of the service in the reference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import CLIPImageProcessor, CLIPImageProcessorPil, CLIPVisionModel

from tests.helpers import data_uri, live_server, noise_image, rows_of


@pytest.mark.parametrize(
    ("backend", "processor_class"), [("pil", CLIPImageProcessorPil), ("torchvision", CLIPImageProcessor)]
)
def test_rows_served_over_http_are_transformers_rows(
    checkpoints: dict[str, Path], tmp_path: Path, backend: str, processor_class: Any
) -> None:
    """The reference: transformers' own processor of that backend and tower, nothing of the service."""
    processor = processor_class.from_pretrained(checkpoints["clip"])
    tower = CLIPVisionModel.from_pretrained(checkpoints["clip"]).eval()
    images = [noise_image(320, 240, seed=7), noise_image(50, 41, seed=8), noise_image(120, 300, seed=9)]
    settings = {"model": checkpoints["clip"], "cache_dir": tmp_path / "cache", "image_processor_backend": backend}
    with live_server(**settings) as server, server.client() as client:
        response = client.post("/v1/encode", json={"items": [{"image": data_uri(image)} for image in images]})
    assert response.status_code == 200, response.text
    with torch.inference_mode():  # one batch, as the service ran this request
        expected = tower(pixel_values=processor(images=images, return_tensors="pt")["pixel_values"]).last_hidden_state
    for rows, item in zip(expected, response.json()["items"], strict=True):
        assert torch.equal(rows_of(item), rows)
