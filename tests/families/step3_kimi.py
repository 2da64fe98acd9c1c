"""References for Step3 (``step3p7``) and Kimi (``kimi_k25``): their processors need torchvision.

Everything torchvision-backed is imported inside the functions, so this module imports anywhere; the
tests that call them are marked ``torchvision`` and skipped where it does not import.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from PIL import Image
from transformers import AutoImageProcessor, Kimi_K25ForConditionalGeneration, Step3p7ForConditionalGeneration

from mmencode.models import EncoderAdapter
from tests.families.common import FamilySpec, edit_processor, tiny_tokenizer
from tests.families.qwen import merge_size_four

STEP3_TOKENS = {
    "image_token": "<im_patch>",
    "patch_start_token": "<patch_start>",
    "patch_end_token": "<patch_end>",
    "patch_newline_token": "<patch_newline>",
    "image_start_token": "<im_start>",
    "image_end_token": "<im_end>",
}


def own_image_processor(directory: Path) -> Any:
    """The checkpoint's image processor as transformers itself loads it (not the adapter's instance)."""
    return AutoImageProcessor.from_pretrained(directory)


# ----- Step3 -----
def _step3_reference(directory: Path, images: list[Image.Image], adapter: EncoderAdapter) -> list[torch.Tensor]:
    inputs = own_image_processor(directory)(images=images, return_tensors="pt")
    model = Step3p7ForConditionalGeneration.from_pretrained(directory).eval()
    with torch.inference_mode():
        out = model.model.get_image_features(
            inputs["pixel_values"], inputs.get("pixel_values_local"), inputs["num_local_patches"].tolist()
        )
    # pooler_output: per image, the local crops' rows then the global view's, as forward scatters them.
    return list(out.pooler_output)


def _step3_placeholders(adapter: EncoderAdapter, image: Image.Image) -> int:
    # The real Step3p7Processor end to end: its replace_image_token expands one <im_patch> per image.
    from transformers import Step3p7Processor

    tokenizer = tiny_tokenizer(**STEP3_TOKENS)
    processor = Step3p7Processor(image_processor=own_image_processor(adapter.checkpoint), tokenizer=tokenizer)
    inputs = processor(text="a <im_patch> a", images=[image], return_tensors="pt")
    image_id = tokenizer.convert_tokens_to_ids("<im_patch>")
    return int((inputs["input_ids"] == image_id).sum())


def vision_patch_28(whole: dict[str, Any]) -> None:
    # The processor counts rows for a 28 px ViT patch (1 row per 112 px crop); the tower's patch is 14.
    whole["image_processor"]["vision_patch_size"] = 28


# ----- Kimi -----
def _kimi_reference(directory: Path, images: list[Image.Image], adapter: EncoderAdapter) -> list[torch.Tensor]:
    inputs = own_image_processor(directory)(images=images, return_tensors="pt")
    model = Kimi_K25ForConditionalGeneration.from_pretrained(directory).eval()
    with torch.inference_mode():
        return list(model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"]).pooler_output)


def _kimi_placeholders(adapter: EncoderAdapter, image: Image.Image) -> int:
    # The real Kimi_K25Processor: the count written into the prompt (replace_image_token, via __call__)
    # must agree with the one vLLM asks for without the image (_get_num_multimodal_tokens).
    from transformers import Kimi_K25Processor, Kimi_K25VideoProcessor

    tokenizer = tiny_tokenizer(image_token="<|media_pad|>")
    processor = Kimi_K25Processor(
        image_processor=own_image_processor(adapter.checkpoint),
        tokenizer=tokenizer,
        video_processor=Kimi_K25VideoProcessor(),  # required by the constructor; images only here
    )
    inputs = processor(text="a <|media_pad|> a", images=[image], return_tensors="pt")
    written = int((inputs["input_ids"] == processor.image_token_id).sum())
    predicted = processor._get_num_multimodal_tokens(image_sizes=[(image.height, image.width)])
    assert predicted["num_image_tokens"] == [written]
    return written


SPECS: dict[str, FamilySpec] = {
    "step3p7": FamilySpec(
        "step3p7",
        ("num_patches",),
        _step3_reference,
        _step3_placeholders,
        lambda src, dst: edit_processor(src, dst, vision_patch_28),
    ),
    "kimi_k25": FamilySpec(
        "kimi_k25",
        ("image_grid_thw",),
        _kimi_reference,
        _kimi_placeholders,
        lambda src, dst: edit_processor(src, dst, merge_size_four),
    ),
}
