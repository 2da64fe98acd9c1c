"""Tiny Qwen-style dynamic-resolution VLMs: Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5, GLM-4.1V."""

from __future__ import annotations

from typing import Any

from transformers import (
    Glm4vConfig,
    Glm4vForConditionalGeneration,
    Glm4vImageProcessorPil,
    PreTrainedModel,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
    Qwen2VLVisionConfig,
    Qwen3_5Config,
    Qwen3_5ForConditionalGeneration,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
)
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

from mmencode.models.tiny.common import QWEN3_TOKENS, TEXT_CONFIG, Layout, TinyProcessor


def qwen2_vl(layout: Layout, processor_merge_size: int) -> tuple[PreTrainedModel, TinyProcessor]:
    vision: dict[str, Any] = {
        "depth": 2,
        "embed_dim": 32,
        "hidden_size": 64,
        "num_heads": 2,
        "mlp_ratio": 2,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    }
    if layout == "full":
        config = Qwen2VLConfig(
            text_config={**TEXT_CONFIG, "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}},
            vision_config=vision,
        )
        model: PreTrainedModel = Qwen2VLForConditionalGeneration(config)
    else:
        model = Qwen2VisionTransformerPretrainedModel(Qwen2VLVisionConfig(**vision))
    # merge_size is the processor's own: a mismatched fixture sets it apart from the tower's merger.
    processor = Qwen2VLImageProcessorPil(
        size={"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 64},
        patch_size=14,
        temporal_patch_size=2,
        merge_size=processor_merge_size,
    )
    return model, TinyProcessor(processor, "Qwen2VLProcessor")


def qwen2_5_vl(layout: Layout, processor_merge_size: int) -> tuple[PreTrainedModel, TinyProcessor]:
    if layout != "full":
        raise ValueError("tiny Qwen2.5-VL checkpoints come as full VLMs (the tower alone is qwen2_vl's layout)")
    vision: dict[str, Any] = {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": 64,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        # Windowed attention in block 0, full attention in block 1, as the released towers alternate.
        "window_size": 56,
        "fullatt_block_indexes": [1],
    }
    text = {**TEXT_CONFIG, "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}}
    model = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(text_config=text, vision_config=vision))
    processor = Qwen2VLImageProcessorPil(
        size={"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 64},
        patch_size=14,
        temporal_patch_size=2,
        merge_size=processor_merge_size,
    )
    return model, TinyProcessor(processor, "Qwen2_5_VLProcessor")


def qwen3_vl(layout: Layout, processor_merge_size: int) -> tuple[PreTrainedModel, TinyProcessor]:
    if layout != "full":
        raise ValueError("Qwen3-VL checkpoints only come as full VLMs")
    text = {
        **TEXT_CONFIG,
        "head_dim": 32,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6]},
    }
    vision: dict[str, Any] = {
        "depth": 3,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": 64,
        "num_position_embeddings": 64,
        "deepstack_visual_indexes": [0, 1],
    }
    model = Qwen3VLForConditionalGeneration(Qwen3VLConfig(text_config=text, vision_config=vision, **QWEN3_TOKENS))
    processor = Qwen2VLImageProcessorPil(
        size={"shortest_edge": 64 * 64, "longest_edge": 32 * 32 * 64},
        patch_size=16,
        temporal_patch_size=2,
        merge_size=processor_merge_size,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    # As the Qwen3-VL repos ship it: the torchvision class named, Qwen2-VL's processor underneath.
    return model, TinyProcessor(processor, "Qwen3VLProcessor", {}, "nested", "Qwen2VLImageProcessorFast")


def qwen3_5(layout: Layout, processor_merge_size: int) -> tuple[PreTrainedModel, TinyProcessor]:
    if layout != "full":
        raise ValueError("Qwen3.5 checkpoints only come as full VLMs")
    text = {
        **TEXT_CONFIG,
        "num_hidden_layers": 2,
        "head_dim": 32,
        "layer_types": ["linear_attention", "full_attention"],
        "linear_num_value_heads": 2,
        "linear_num_key_heads": 1,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [2, 3, 3],
            "partial_rotary_factor": 0.5,
        },
    }
    vision: dict[str, Any] = {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": 64,
        "num_position_embeddings": 64,
    }
    model = Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=text, vision_config=vision, **QWEN3_TOKENS))
    processor = Qwen2VLImageProcessorPil(
        size={"shortest_edge": 64 * 64, "longest_edge": 32 * 32 * 64},
        patch_size=16,
        temporal_patch_size=2,
        merge_size=processor_merge_size,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    return model, TinyProcessor(processor, "Qwen3VLProcessor", {}, "nested", "Qwen2VLImageProcessorFast")


def glm4v(layout: Layout, processor_merge_size: int) -> tuple[PreTrainedModel, TinyProcessor]:
    if layout != "full":
        raise ValueError("GLM-4.1V checkpoints only come as full VLMs")
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3], "partial_rotary_factor": 0.5}
    vision: dict[str, Any] = {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "patch_size": 14,
        "image_size": 56,  # a 4x4 grid of learned positions, resampled to each image's grid
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": 64,
    }
    tokens: dict[str, Any] = {
        "image_token_id": 10,
        "video_token_id": 11,
        "image_start_token_id": 12,
        "image_end_token_id": 13,
    }
    config = Glm4vConfig(text_config={**TEXT_CONFIG, "rope_parameters": rope}, vision_config=vision, **tokens)
    model: PreTrainedModel = Glm4vForConditionalGeneration(config)
    # Settings the class reads but does not declare as typed kwargs.
    grid: dict[str, Any] = {"patch_size": 14, "temporal_patch_size": 2, "merge_size": processor_merge_size}
    processor = Glm4vImageProcessorPil(size={"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 64}, **grid)
    return model, TinyProcessor(processor, "Glm4vProcessor", {}, "nested")
