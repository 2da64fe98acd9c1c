"""The service's encoders give what transformers itself gives for the same checkpoint.

The reference loads the *full* checkpoint with the model class users would use
(``Qwen2VLForConditionalGeneration``, ``SiglipModel``, ``CLIPModel``, ``InternVLForConditionalGeneration``)
and runs the same image processor over all images at once. fp32 on CPU: a tolerance of 1e-5
absolute covers reassociation in packed attention; in practice the values are bit-identical.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image
from transformers import (
    CLIPModel,
    CLIPVisionModel,
    InternVLForConditionalGeneration,
    Qwen2VLForConditionalGeneration,
    SiglipModel,
    SiglipVisionModel,
)
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

from mmencode.models import EncoderAdapter, load_encoder
from tests.helpers import noise_image

CPU = torch.device("cpu")
ATOL = 1e-5

# Different sizes and aspect ratios: Qwen2-VL packs them, InternVL cuts different tile counts.
IMAGES = [noise_image(120, 90, seed=1), noise_image(64, 200, seed=2), noise_image(300, 160, seed=3)]
# Sizes exactly on each tiny checkpoint's boundaries, where a rounding that is off by one shows: Qwen2-VL's
# 28-pixel grid at its pixel budget's floor (56x56 = min_pixels) and ceiling (224x224 = max_pixels) and one
# grid column past it; CLIP's and SigLIP's 64-pixel resize and crop, and a side twice that; InternVL's
# 64-pixel tile, and exactly its 6-tile ceiling both ways (2x3 and 6x1).
EDGES = {
    "qwen2_vl": [(56, 56), (224, 224), (252, 224), (112, 84)],
    "clip": [(64, 64), (128, 64), (64, 128)],
    "siglip": [(64, 64), (128, 64)],
    "internvl": [(64, 64), (128, 192), (384, 64)],
}


def _images(name: str, sizes: str) -> list[Image.Image]:
    if sizes == "mixed":
        return IMAGES
    family = name.removesuffix("-vision")
    return [noise_image(w, h, seed=10 + i) for i, (w, h) in enumerate(EDGES[family])]


def _service_rows(adapter: EncoderAdapter, images: list[Image.Image]) -> list[torch.Tensor]:
    prepared = [adapter.preprocess(image) for image in images]
    output = adapter.forward(prepared)
    return list(torch.split(output.rows, [p.num_tokens for p in prepared]))


def _reference(name: str, directory: Path, images: list[Image.Image], processor: Any) -> list[torch.Tensor]:
    with torch.inference_mode():
        if name.startswith("qwen2_vl"):
            inputs = processor(images=images, return_tensors="pt")
            if name == "qwen2_vl":
                model: Any = Qwen2VLForConditionalGeneration.from_pretrained(directory).eval()
                out = model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"])
                return list(out.pooler_output)
            tower = Qwen2VisionTransformerPretrainedModel.from_pretrained(directory).eval()
            rows = tower(inputs["pixel_values"], grid_thw=inputs["image_grid_thw"]).pooler_output
            sizes = (inputs["image_grid_thw"].prod(-1) // 4).tolist()
            return list(torch.split(rows, sizes))
        if name.startswith(("siglip", "clip")):
            pixel_values = processor(images=images, return_tensors="pt")["pixel_values"]
            full = {"siglip": SiglipModel, "clip": CLIPModel}
            tower_only = {"siglip-vision": SiglipVisionModel, "clip-vision": CLIPVisionModel}
            if name in full:
                model = full[name].from_pretrained(directory).eval()
                return list(model.vision_model(pixel_values=pixel_values).last_hidden_state)
            model = tower_only[name].from_pretrained(directory).eval()
            return list(model(pixel_values=pixel_values).last_hidden_state)
        if name == "internvl":
            inputs = processor(images=images, crop_to_patches=True, return_tensors="pt")
            model = InternVLForConditionalGeneration.from_pretrained(directory).eval()
            tiles = model.get_image_features(pixel_values=inputs["pixel_values"]).pooler_output
            per_image = torch.split(tiles, inputs["num_patches"].tolist())
            return [chunk.reshape(-1, chunk.shape[-1]) for chunk in per_image]
    raise AssertionError(name)


@pytest.mark.parametrize(
    "name", ["qwen2_vl", "qwen2_vl-vision", "siglip", "siglip-vision", "clip", "clip-vision", "internvl"]
)
@pytest.mark.parametrize("sizes", ["mixed", "edges"])
def test_rows_equal_transformers(name: str, sizes: str, checkpoints: dict[str, Path]) -> None:
    adapter = load_encoder(checkpoints[name], device=CPU, dtype=torch.float32)
    images = _images(name, sizes)
    ours = _service_rows(adapter, images)
    reference = _reference(name, checkpoints[name], images, adapter.processor)
    assert [r.shape for r in ours] == [r.shape for r in reference]
    for got, want in zip(ours, reference, strict=True):
        torch.testing.assert_close(got, want.float(), atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["qwen2_vl", "internvl", "siglip"])
def test_packed_batch_equals_one_image_at_a_time(name: str, checkpoints: dict[str, Path]) -> None:
    adapter = load_encoder(checkpoints[name], device=CPU, dtype=torch.float32)
    packed = _service_rows(adapter, IMAGES)
    alone = [_service_rows(adapter, [image])[0] for image in IMAGES]
    for got, want in zip(packed, alone, strict=True):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def test_predicted_counts_follow_the_family_rules(checkpoints: dict[str, Path]) -> None:
    qwen = load_encoder(checkpoints["qwen2_vl"], device=CPU, dtype=torch.float32)
    item = qwen.preprocess(IMAGES[0])
    t, h, w = item.metadata["image_grid_thw"]
    assert item.num_tokens == t * h * w // 4
    internvl = load_encoder(checkpoints["internvl"], device=CPU, dtype=torch.float32)
    item = internvl.preprocess(IMAGES[2])
    # 64x64 tiles of 8x8 patches, pixel-shuffled by 0.5: 16 rows per tile; a wide image makes several.
    assert item.metadata["num_patches"] > 1
    assert item.num_tokens == item.metadata["num_patches"] * 16
    clip = load_encoder(checkpoints["clip"], device=CPU, dtype=torch.float32)
    assert clip.preprocess(IMAGES[0]).num_tokens == 8 * 8 + 1
