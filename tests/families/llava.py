"""References for Gemma 3, Idefics3 / SmolVLM, Mistral 3, LLaVA-OneVision and LLaVA-NeXT."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from transformers import (
    Gemma3ForConditionalGeneration,
    Gemma3Processor,
    Idefics3ForConditionalGeneration,
    Idefics3Processor,
    LlavaNextForConditionalGeneration,
    LlavaNextProcessor,
    LlavaOnevisionForConditionalGeneration,
    LlavaOnevisionProcessor,
    Mistral3ForConditionalGeneration,
    PixtralProcessor,
    SmolVLMForConditionalGeneration,
    SmolVLMProcessor,
)

from mmencode.models import EncoderAdapter
from tests.families.common import FamilySpec, bare_processor, edit_processor, tiny_tokenizer


# ----- Gemma 3 -----
def _gemma3_reference(directory: Path, images: list[Image.Image], adapter: EncoderAdapter) -> list[torch.Tensor]:
    inputs = adapter.processor(images=images, return_tensors="pt")
    model = Gemma3ForConditionalGeneration.from_pretrained(directory).eval()
    with torch.inference_mode():
        views = model.model.get_image_features(inputs["pixel_values"]).pooler_output
    # One (mm_tokens_per_image, width) block per view; an image's views are the image then its crops.
    per_image = torch.split(views, [1 + int(n) for n in inputs["num_crops"]])
    return [chunk.reshape(-1, chunk.shape[-1]) for chunk in per_image]


_PAN_AND_SCAN = (
    "do_pan_and_scan",
    "pan_and_scan_min_crop_size",
    "pan_and_scan_max_num_crops",
    "pan_and_scan_min_ratio_to_activate",
)


def _gemma3_placeholders(adapter: EncoderAdapter, image: Image.Image) -> int:
    tokenizer = tiny_tokenizer(
        image_token="<image_soft_token>", boi_token="<start_of_image>", eoi_token="<end_of_image>"
    )
    seq = adapter.processor_config.setting("image_seq_length")
    processor = Gemma3Processor(image_processor=adapter.processor, tokenizer=tokenizer, image_seq_length=seq)
    # Gemma3Processor applies its own pan-and-scan defaults (off) unless the call asks, as vLLM's
    # mm_processor_kwargs do: ask for the checkpoint's settings.
    settings = {name: getattr(adapter.processor, name) for name in _PAN_AND_SCAN}
    ids = processor(text=["a <start_of_image>"], images=[[image]], return_tensors="pt", **settings)["input_ids"]
    return int((ids == tokenizer.convert_tokens_to_ids("<image_soft_token>")).sum())


def _image_seq_length(length: int) -> Callable[[dict[str, Any]], None]:
    def edit(whole: dict[str, Any]) -> None:
        whole["image_seq_length"] = length

    return edit


# ----- Idefics3 / SmolVLM -----
def _idefics3_reference(directory: Path, images: list[Image.Image], adapter: EncoderAdapter) -> list[torch.Tensor]:
    # All three images in one processor call, padded to the same view count as transformers batches them.
    inputs = adapter.processor(images=[[image] for image in images], return_tensors="pt")
    model_class: Any = (
        SmolVLMForConditionalGeneration if adapter.family == "smolvlm" else Idefics3ForConditionalGeneration
    )
    model = model_class.from_pretrained(directory).eval()
    with torch.inference_mode():
        out = model.model.get_image_features(inputs["pixel_values"], inputs["pixel_attention_mask"])
    return list(out.pooler_output)


_IDEFICS3_TOKENS = {
    "image_token": "<image>",
    "fake_image_token": "<fake_token_around_image>",
    "global_image_token": "<global-img>",
    "end_of_utterance_token": "<end_of_utterance>",
}


def _idefics3_placeholders(adapter: EncoderAdapter, image: Image.Image) -> int:
    seq = adapter.processor_config.setting("image_seq_len")
    inputs = adapter.processor(images=[[image]], return_tensors="pt", return_row_col_info=True)
    if adapter.family == "idefics3":
        # The real processor, with a tokenizer: count the <image> ids it writes.
        tokenizer = tiny_tokenizer(**_IDEFICS3_TOKENS)
        processor = Idefics3Processor(image_processor=adapter.processor, tokenizer=tokenizer, image_seq_len=seq)
        ids = processor(text=["a <image>"], images=[[image]], return_tensors="pt")["input_ids"]
        return int((ids == tokenizer.convert_tokens_to_ids("<image>")).sum())
    # SmolVLMProcessor bundles a video processor (torchvision): its own prompt builder, on a bare instance.
    processor = bare_processor(
        SmolVLMProcessor,
        image_processor=adapter.processor,
        image_seq_len=seq,
        image_token="<image>",
        fake_image_token="<fake_token_around_image>",
        global_image_token="<global-img>",
    )
    return str(processor.replace_image_token(inputs, 0)).count("<image>")


def _image_seq_len(length: int) -> Callable[[dict[str, Any]], None]:
    def edit(whole: dict[str, Any]) -> None:
        whole["image_seq_len"] = length

    return edit


# ----- Mistral 3 -----
def _pixtral_processor(adapter: EncoderAdapter) -> PixtralProcessor:
    """The checkpoint's whole PixtralProcessor: it, not its image processor alone, decides the resize."""
    settings = adapter.processor_config.processor
    tokens = {name: settings[name] for name in ("image_token", "image_break_token", "image_end_token")}
    return PixtralProcessor(
        image_processor=adapter.processor,
        tokenizer=tiny_tokenizer(**tokens),
        patch_size=settings["patch_size"],
        spatial_merge_size=settings["spatial_merge_size"],
        **tokens,
    )


def _mistral3_reference(directory: Path, images: list[Image.Image], adapter: EncoderAdapter) -> list[torch.Tensor]:
    text = ["[IMG]"] * len(images)
    # Padded to the largest image, with image_sizes.
    inputs = _pixtral_processor(adapter)(text=text, images=images, padding=True, return_tensors="pt")
    model = Mistral3ForConditionalGeneration.from_pretrained(directory).eval()
    with torch.inference_mode():
        return list(model.model.get_image_features(inputs["pixel_values"], inputs["image_sizes"]).pooler_output)


def _mistral3_placeholders(adapter: EncoderAdapter, image: Image.Image) -> int:
    processor = _pixtral_processor(adapter)
    input_ids = processor(text="[IMG]", images=[image], return_tensors="pt")["input_ids"][0]
    return int((input_ids == processor.image_token_id).sum())


def _spatial_merge_size_one(whole: dict[str, Any]) -> None:
    whole["spatial_merge_size"] = 1


# ----- LLaVA-OneVision -----
def _llava_onevision_reference(
    directory: Path, images: list[Image.Image], adapter: EncoderAdapter
) -> list[torch.Tensor]:
    inputs = adapter.processor(images=images, return_tensors="pt")  # tiles padded to the largest count
    model = LlavaOnevisionForConditionalGeneration.from_pretrained(directory).eval()
    config = model.config
    with torch.inference_mode():
        packed = model.model.get_image_features(
            inputs["pixel_values"],
            inputs["image_sizes"],
            vision_feature_layer=config.vision_feature_layer,
            vision_feature_select_strategy=config.vision_feature_select_strategy,
            vision_aspect_ratio=config.vision_aspect_ratio,
            batch_num_images=inputs["batch_num_images"],
        ).pooler_output
    return list(packed)  # one tensor per image: base tile, unpadded map, newlines


def _llava_onevision_placeholders(adapter: EncoderAdapter, image: Image.Image) -> int:
    settings = adapter.processor_config.processor
    processor = bare_processor(
        LlavaOnevisionProcessor,
        image_processor=adapter.processor,
        image_token="<image>",
        num_image_tokens=settings["num_image_tokens"],
        vision_feature_select_strategy=settings["vision_feature_select_strategy"],
        vision_aspect_ratio=settings["vision_aspect_ratio"],
    )
    inputs = adapter.processor(images=[image], return_tensors="pt")
    return str(processor.replace_image_token(inputs, 0)).count("<image>")


# ----- LLaVA-NeXT -----
def _llava_next_reference(directory: Path, images: list[Image.Image], adapter: EncoderAdapter) -> list[torch.Tensor]:
    inputs = adapter.processor(images=images, return_tensors="pt")
    model = LlavaNextForConditionalGeneration.from_pretrained(directory).eval()
    config = model.config
    with torch.inference_mode():
        packed = model.model.get_image_features(
            inputs["pixel_values"],
            inputs["image_sizes"],
            vision_feature_layer=config.vision_feature_layer,
            vision_feature_select_strategy=config.vision_feature_select_strategy,
        ).pooler_output
    return list(packed)


def _llava_next_placeholders(adapter: EncoderAdapter, image: Image.Image) -> int:
    settings = adapter.processor_config.processor
    processor = bare_processor(
        LlavaNextProcessor,
        image_processor=adapter.processor,
        image_token="<image>",
        patch_size=settings["patch_size"],
        num_additional_image_tokens=settings["num_additional_image_tokens"],
        vision_feature_select_strategy=settings["vision_feature_select_strategy"],
    )
    inputs = adapter.processor(images=[image], return_tensors="pt")
    return str(processor.replace_image_token(inputs, 0)).count("<image>")


def _patch_size_four(whole: dict[str, Any]) -> None:
    # The processor counts 4-pixel patches; the tower's are 8.
    whole["patch_size"] = 4


def _num_image_tokens(whole: dict[str, Any]) -> None:
    # The processor believes in 5x5 patches per tile; the tower makes 4x4.
    whole["num_image_tokens"] = 25


SPECS: dict[str, FamilySpec] = {
    "gemma3": FamilySpec(
        "gemma3",
        ("num_crops",),
        _gemma3_reference,
        _gemma3_placeholders,
        # The processor writes 9 soft tokens per view; the model pools to 16.
        lambda src, dst: edit_processor(src, dst, _image_seq_length(9)),
    ),
    **{
        family: FamilySpec(
            family,
            ("crop_grid",),
            _idefics3_reference,
            _idefics3_placeholders,
            # The processor writes 9 <image> tokens per view; the connector yields 16.
            lambda src, dst: edit_processor(src, dst, _image_seq_len(9)),
        )
        for family in ("idefics3", "smolvlm")
    },
    "mistral3": FamilySpec(
        "mistral3",
        ("image_sizes",),
        _mistral3_reference,
        _mistral3_placeholders,
        # The processor counts one [IMG] per patch; the projector merges 2x2.
        lambda src, dst: edit_processor(src, dst, _spatial_merge_size_one),
    ),
    "llava_onevision": FamilySpec(
        "llava_onevision",
        ("image_sizes",),
        _llava_onevision_reference,
        _llava_onevision_placeholders,
        lambda src, dst: edit_processor(src, dst, _num_image_tokens),
    ),
    "llava_next": FamilySpec(
        "llava_next",
        ("image_sizes",),
        _llava_next_reference,
        _llava_next_placeholders,
        lambda src, dst: edit_processor(src, dst, _patch_size_four),
    ),
}
