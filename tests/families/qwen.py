"""References for Qwen2.5-VL, Qwen3-VL, Qwen3.5 and GLM-4.1V (Qwen2-VL's are tests/test_equivalence.py's)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from transformers import (
    Glm4vForConditionalGeneration,
    Glm4vProcessor,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLProcessor,
    Qwen3_5ForConditionalGeneration,
    Qwen3VLForConditionalGeneration,
    Qwen3VLProcessor,
)

from mmencode.models import EncoderAdapter
from tests.families.common import FamilySpec, bare_processor, edit_processor


# ----- Qwen2.5-VL -----
def _qwen2_5_vl_reference(directory: Path, images: list[Image.Image], adapter: EncoderAdapter) -> list[torch.Tensor]:
    inputs = adapter.processor(images=images, return_tensors="pt")
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(directory).eval()
    with torch.inference_mode():
        return list(model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"]).pooler_output)


def _qwen2_5_vl_placeholders(adapter: EncoderAdapter, image: Image.Image) -> int:
    processor = bare_processor(Qwen2_5_VLProcessor, image_processor=adapter.processor, image_token="<|image_pad|>")
    inputs = adapter.processor(images=[image], return_tensors="pt")
    return str(processor.replace_image_token(inputs, 0)).count("<|image_pad|>")


def _legacy_merge_size_four(src: Path, dst: Path) -> Path:
    """The Qwen2.5-VL repos' layout: the image processor alone, in preprocessor_config.json."""
    shutil.copytree(src, dst)
    settings = json.loads((dst / "preprocessor_config.json").read_text())
    settings["merge_size"] = 4
    (dst / "preprocessor_config.json").write_text(json.dumps(settings))
    return dst


# ----- Qwen3-VL -----
def _qwen3_vl_reference(directory: Path, images: list[Image.Image], adapter: EncoderAdapter) -> list[torch.Tensor]:
    inputs = adapter.processor(images=images, return_tensors="pt")
    model = Qwen3VLForConditionalGeneration.from_pretrained(directory).eval()
    with torch.inference_mode():
        out = model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"])
    # pooler_output: what is scattered at the <|image_pad|> tokens; deepstack_features: what the first
    # decoder layers add at the same positions, level by level.
    per_image = zip(out.pooler_output, *out.deepstack_features, strict=True)
    return [torch.cat([main, *levels], dim=-1) for main, *levels in per_image]


def _qwen3_vl_placeholders(adapter: EncoderAdapter, image: Image.Image) -> int:
    processor = bare_processor(Qwen3VLProcessor, image_processor=adapter.processor, image_token="<|image_pad|>")
    inputs = adapter.processor(images=[image], return_tensors="pt")
    return str(processor.replace_image_token(inputs, 0)).count("<|image_pad|>")


def _qwen3_5_reference(directory: Path, images: list[Image.Image], adapter: EncoderAdapter) -> list[torch.Tensor]:
    inputs = adapter.processor(images=images, return_tensors="pt")
    model = Qwen3_5ForConditionalGeneration.from_pretrained(directory).eval()
    with torch.inference_mode():
        return list(model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"]).pooler_output)


def merge_size_four(whole: dict[str, Any]) -> None:
    # The processor groups 4x4 patches per placeholder; the tower still merges 2x2 (grids stay even).
    whole["image_processor"]["merge_size"] = 4


# ----- GLM-4.1V -----
def _glm4v_reference(directory: Path, images: list[Image.Image], adapter: EncoderAdapter) -> list[torch.Tensor]:
    inputs = adapter.processor(images=images, return_tensors="pt")
    model = Glm4vForConditionalGeneration.from_pretrained(directory).eval()
    with torch.inference_mode():
        return list(model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"]).pooler_output)


def _glm4v_placeholders(adapter: EncoderAdapter, image: Image.Image) -> int:
    processor = bare_processor(Glm4vProcessor, image_processor=adapter.processor, image_token="<|image|>")
    inputs = adapter.processor(images=[image], return_tensors="pt")
    return str(processor.replace_image_token(inputs, 0)).count("<|image|>")


SPECS: dict[str, FamilySpec] = {
    "qwen2_5_vl": FamilySpec(
        "qwen2_5_vl",
        ("image_grid_thw",),
        _qwen2_5_vl_reference,
        _qwen2_5_vl_placeholders,
        _legacy_merge_size_four,
    ),
    "qwen3_vl": FamilySpec(
        "qwen3_vl",
        ("image_grid_thw",),
        _qwen3_vl_reference,
        _qwen3_vl_placeholders,
        lambda src, dst: edit_processor(src, dst, merge_size_four),
    ),
    "qwen3_5": FamilySpec(
        "qwen3_5",
        ("image_grid_thw",),
        _qwen3_5_reference,
        _qwen3_vl_placeholders,  # Qwen3.5 repos name Qwen3VLProcessor
        lambda src, dst: edit_processor(src, dst, merge_size_four),
    ),
    "glm4v": FamilySpec(
        "glm4v",
        ("image_grid_thw",),
        _glm4v_reference,
        _glm4v_placeholders,
        lambda src, dst: edit_processor(src, dst, merge_size_four),
    ),
}
