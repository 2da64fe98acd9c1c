"""References for Qwen2.5-VL, Qwen3-VL, Qwen3.5 and GLM-4.1V (Qwen2-VL's: tests/unit/models/test_equivalence.py)."""

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


def _pooled_reference(model_class: Any) -> Any:
    """The rows a Qwen2-VL-style model scatters at its image tokens (``get_image_features``'s pooler_output)."""

    def reference(directory: Path, images: list[Image.Image], adapter: EncoderAdapter) -> list[torch.Tensor]:
        inputs = adapter.processor(images=images, return_tensors="pt")
        model = model_class.from_pretrained(directory).eval()
        with torch.inference_mode():
            out = model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"])
        return list(out.pooler_output)

    return reference


def _placeholder_count(processor_class: type, token: str) -> Any:
    """The placeholders the family's own processor writes for one image (its ``replace_image_token``)."""

    def count(adapter: EncoderAdapter, image: Image.Image) -> int:
        processor = bare_processor(processor_class, image_processor=adapter.processor, image_token=token)
        inputs = adapter.processor(images=[image], return_tensors="pt")
        return str(processor.replace_image_token(inputs, 0)).count(token)

    return count


# ----- Qwen2.5-VL -----
_qwen2_5_vl_reference = _pooled_reference(Qwen2_5_VLForConditionalGeneration)


_qwen2_5_vl_placeholders = _placeholder_count(Qwen2_5_VLProcessor, "<|image_pad|>")


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


_qwen3_vl_placeholders = _placeholder_count(Qwen3VLProcessor, "<|image_pad|>")


_qwen3_5_reference = _pooled_reference(Qwen3_5ForConditionalGeneration)


def merge_size_four(whole: dict[str, Any]) -> None:
    # The processor groups 4x4 patches per placeholder; the tower still merges 2x2 (grids stay even).
    whole["image_processor"]["merge_size"] = 4


# ----- GLM-4.1V -----
_glm4v_reference = _pooled_reference(Glm4vForConditionalGeneration)


_glm4v_placeholders = _placeholder_count(Glm4vProcessor, "<|image|>")


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
