"""Tiny LLaVA-style VLMs (tower + projector + language model): Gemma 3, Idefics3, SmolVLM, Mistral 3,
LLaVA-OneVision, LLaVA-NeXT."""

from __future__ import annotations

from typing import Any

from transformers import (
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Gemma3ImageProcessorPil,
    Idefics3Config,
    Idefics3ForConditionalGeneration,
    Idefics3ImageProcessorPil,
    LlavaNextConfig,
    LlavaNextForConditionalGeneration,
    LlavaNextImageProcessorPil,
    LlavaOnevisionConfig,
    LlavaOnevisionForConditionalGeneration,
    LlavaOnevisionImageProcessorPil,
    Mistral3Config,
    Mistral3ForConditionalGeneration,
    PixtralImageProcessorPil,
    PreTrainedModel,
    SmolVLMConfig,
    SmolVLMForConditionalGeneration,
    SmolVLMImageProcessorPil,
)

from mmencode.models.tiny.common import CLIP_MEAN, CLIP_STD, TEXT_CONFIG, Layout, TinyProcessor


def gemma3(layout: Layout, _: int) -> tuple[PreTrainedModel, TinyProcessor]:
    if layout != "full":
        raise ValueError("Gemma 3 checkpoints only come as full VLMs")
    vision: dict[str, Any] = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 64,
        "patch_size": 8,
    }
    config = Gemma3Config(
        text_config={**TEXT_CONFIG, "head_dim": 32},
        vision_config=vision,
        mm_tokens_per_image=16,  # 8x8 patches average-pooled 2x2
        image_token_index=5,
        boi_token_index=6,
        eoi_token_index=7,
    )
    model: PreTrainedModel = Gemma3ForConditionalGeneration(config)
    # Pan-and-scan on, with crop limits small enough for test images: crops vary with the aspect ratio.
    processor = Gemma3ImageProcessorPil(
        size={"height": 64, "width": 64},
        do_pan_and_scan=True,
        pan_and_scan_min_crop_size=32,
        pan_and_scan_max_num_crops=4,
        pan_and_scan_min_ratio_to_activate=1.2,
    )
    return model, TinyProcessor(processor, "Gemma3Processor", {"image_seq_length": 16}, "nested")


def idefics3(layout: Layout, _: int, *, smol: bool = False) -> tuple[PreTrainedModel, TinyProcessor]:
    if layout != "full":
        raise ValueError("Idefics3 / SmolVLM checkpoints only come as full VLMs")
    vision: dict[str, Any] = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 64,
        "patch_size": 8,
    }
    text = {**TEXT_CONFIG, "model_type": "llama"}
    # 8x8 patches per 64-pixel view, pixel-shuffled by 2: 16 rows per view.
    settings: dict[str, Any] = {"image_seq_len": 16}
    sizes: dict[str, Any] = {"size": {"longest_edge": 128}, "max_image_size": {"longest_edge": 64}}
    if smol:
        model: PreTrainedModel = SmolVLMForConditionalGeneration(
            SmolVLMConfig(text_config=text, vision_config=vision, scale_factor=2, image_token_id=5)
        )
        processor: Any = SmolVLMImageProcessorPil(do_image_splitting=True, **sizes)
        return model, TinyProcessor(processor, "SmolVLMProcessor", settings, "nested")
    model = Idefics3ForConditionalGeneration(
        Idefics3Config(text_config=text, vision_config=vision, scale_factor=2, image_token_id=5)
    )
    processor = Idefics3ImageProcessorPil(do_image_splitting=True, **sizes)
    return model, TinyProcessor(processor, "Idefics3Processor", settings, "nested")


def smolvlm(layout: Layout, merge: int) -> tuple[PreTrainedModel, TinyProcessor]:
    return idefics3(layout, merge, smol=True)


def mistral3(layout: Layout, _: int) -> tuple[PreTrainedModel, TinyProcessor]:
    if layout != "full":
        raise ValueError("Mistral 3 checkpoints only come as full VLMs")
    vision: dict[str, Any] = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "head_dim": 16,
        "image_size": 128,
        "patch_size": 8,
    }
    config = Mistral3Config(
        text_config={**TEXT_CONFIG, "head_dim": 32}, vision_config=vision, spatial_merge_size=2, image_token_index=5
    )
    model: PreTrainedModel = Mistral3ForConditionalGeneration(config)
    processor = PixtralImageProcessorPil(size={"longest_edge": 128}, patch_size={"height": 8, "width": 8})
    # PixtralProcessor's own settings, as the Mistral 3 repos ship them in processor_config.json.
    settings = {
        "patch_size": 8,
        "spatial_merge_size": 2,
        "image_token": "[IMG]",
        "image_break_token": "[IMG_BREAK]",
        "image_end_token": "[IMG_END]",
    }
    return model, TinyProcessor(processor, "PixtralProcessor", settings, "nested")


def llava_onevision(layout: Layout, _: int) -> tuple[PreTrainedModel, TinyProcessor]:
    if layout != "full":
        raise ValueError("LLaVA-OneVision checkpoints only come as full VLMs")
    vision: dict[str, Any] = {
        "model_type": "siglip_vision_model",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 32,
        "patch_size": 8,
    }
    # Grids of up to 3x3 tiles of 32 pixels; anyres_max_4 makes the biggest maps shrink, as 9 does for real.
    pinpoints = [[32 * h, 32 * w] for h in (1, 2, 3) for w in (1, 2, 3)]
    config = LlavaOnevisionConfig(
        text_config={**TEXT_CONFIG, "model_type": "qwen2"},
        vision_config=vision,
        image_grid_pinpoints=pinpoints,
        vision_feature_layer=-1,
        vision_feature_select_strategy="full",
        vision_aspect_ratio="anyres_max_4",
        image_token_index=5,
        video_token_index=6,
    )
    model: PreTrainedModel = LlavaOnevisionForConditionalGeneration(config)
    processor = LlavaOnevisionImageProcessorPil(size={"height": 32, "width": 32}, image_grid_pinpoints=pinpoints)
    settings = {
        "num_image_tokens": 16,  # 4x4 patches per tile
        "vision_feature_select_strategy": "full",
        "vision_aspect_ratio": "anyres_max_4",
        "image_token": "<image>",
    }
    return model, TinyProcessor(processor, "LlavaOnevisionProcessor", settings, "nested")


def llava_next(layout: Layout, _: int) -> tuple[PreTrainedModel, TinyProcessor]:
    if layout != "full":
        raise ValueError("LLaVA-NeXT checkpoints only come as full VLMs")
    vision: dict[str, Any] = {
        "model_type": "clip_vision_model",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 32,
        "patch_size": 8,
        "projection_dim": 32,
    }
    pinpoints = [[32 * h, 32 * w] for h in (1, 2, 3) for w in (1, 2, 3)]
    config = LlavaNextConfig(
        text_config={**TEXT_CONFIG, "model_type": "qwen2"},
        vision_config=vision,
        image_grid_pinpoints=pinpoints,
        vision_feature_layer=-2,  # as llava-v1.6: the penultimate CLIP layer, class token dropped
        vision_feature_select_strategy="default",
        image_token_index=5,
    )
    model: PreTrainedModel = LlavaNextForConditionalGeneration(config)
    processor = LlavaNextImageProcessorPil(
        size={"shortest_edge": 32},
        crop_size={"height": 32, "width": 32},
        image_grid_pinpoints=pinpoints,
        image_mean=CLIP_MEAN,
        image_std=CLIP_STD,
    )
    settings = {
        "patch_size": 8,
        "num_additional_image_tokens": 1,
        "vision_feature_select_strategy": "default",
        "image_token": "<image>",
    }
    return model, TinyProcessor(processor, "LlavaNextProcessor", settings, "nested")
