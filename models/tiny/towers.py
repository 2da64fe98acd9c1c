"""Tiny fixed-resolution towers and dual encoders: SigLIP, CLIP."""

from __future__ import annotations

from typing import Any

from transformers import (
    CLIPConfig,
    CLIPImageProcessorPil,
    CLIPModel,
    CLIPVisionConfig,
    CLIPVisionModel,
    PreTrainedModel,
    SiglipConfig,
    SiglipImageProcessorPil,
    SiglipModel,
    SiglipVisionConfig,
    SiglipVisionModel,
)

from mmencode.models.tiny.common import CLIP_MEAN, CLIP_STD, Layout, TinyProcessor


def siglip(layout: Layout, _: int) -> tuple[PreTrainedModel, TinyProcessor]:
    vision: dict[str, Any] = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 64,
        "patch_size": 8,
    }
    if layout == "full":
        text = {
            "vocab_size": 256,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "max_position_embeddings": 16,
            "bos_token_id": 1,
            "eos_token_id": 2,
        }
        model: PreTrainedModel = SiglipModel(SiglipConfig(text_config=text, vision_config=vision))
    else:
        model = SiglipVisionModel(SiglipVisionConfig(**vision))
    processor = SiglipImageProcessorPil(size={"height": 64, "width": 64})
    return model, TinyProcessor(processor, "SiglipProcessor")


def clip(layout: Layout, _: int) -> tuple[PreTrainedModel, TinyProcessor]:
    vision: dict[str, Any] = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 64,
        "patch_size": 8,
        "projection_dim": 32,
    }
    if layout == "full":
        text = {
            "vocab_size": 256,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "max_position_embeddings": 32,
            "projection_dim": 32,
            "bos_token_id": 1,
            "eos_token_id": 2,
        }
        model: PreTrainedModel = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=32))
    else:
        model = CLIPVisionModel(CLIPVisionConfig(**vision))
    processor = CLIPImageProcessorPil(
        size={"shortest_edge": 64}, crop_size={"height": 64, "width": 64}, image_mean=CLIP_MEAN, image_std=CLIP_STD
    )
    return model, TinyProcessor(processor, "CLIPProcessor")
