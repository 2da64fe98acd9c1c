"""Deterministic tiny checkpoints of every family, in the layouts users download.

Weights are drawn per tensor from a generator seeded by the tensor's name, so a checkpoint is the same
on every torch/transformers version whatever order layers are constructed in. The result is a normal
``save_pretrained`` directory (config, safetensors, processor config) loaded by the same path as a
real model. Full-VLM layouts include a (tiny) language model that the service must never load.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    CLIPConfig,
    CLIPImageProcessorPil,
    CLIPModel,
    CLIPVisionConfig,
    CLIPVisionModel,
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Gemma3ImageProcessorPil,
    Glm4vConfig,
    Glm4vForConditionalGeneration,
    Glm4vImageProcessorPil,
    GotOcr2ImageProcessorPil,
    Idefics3Config,
    Idefics3ForConditionalGeneration,
    Idefics3ImageProcessorPil,
    InternVLConfig,
    InternVLForConditionalGeneration,
    InternVLVisionConfig,
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
    Qwen2Config,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
    Qwen2VLVisionConfig,
    Qwen3_5Config,
    Qwen3_5ForConditionalGeneration,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    SiglipConfig,
    SiglipImageProcessorPil,
    SiglipModel,
    SiglipVisionConfig,
    SiglipVisionModel,
    SmolVLMConfig,
    SmolVLMForConditionalGeneration,
    SmolVLMImageProcessorPil,
)
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel
from transformers.utils import logging as hf_logging

__all__ = ["FAMILIES", "Layout", "ProcessorLayout", "TinyProcessor", "build_tiny", "fill_deterministic"]

Layout = Literal["full", "vision"]
# "nested": one processor_config.json with the image processor inside, as transformers 5 saves a whole
# processor; "legacy": preprocessor_config.json (plus processor_config.json for processor-level settings).
ProcessorLayout = Literal["nested", "legacy"]

_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
_QWEN3_TOKENS: dict[str, Any] = {
    "image_token_id": 10,
    "video_token_id": 11,
    "vision_start_token_id": 12,
    "vision_end_token_id": 13,
}
_IMAGENET_MEAN = [0.485, 0.456, 0.406]
_IMAGENET_STD = [0.229, 0.224, 0.225]
_TEXT: dict[str, Any] = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 128,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


@dataclass(frozen=True)
class TinyProcessor:
    """What a family's whole processor saves, without the tokenizer the encoder never needs.

    The whole-processor classes of several families cannot be built without torchvision (they bundle a
    video processor), so the file is written here in the format ``ProcessorMixin.save_pretrained`` uses.
    """

    image_processor: Any
    processor_class: str
    # Processor-level settings: image_seq_length, num_image_tokens...
    settings: dict[str, Any] = field(default_factory=dict)
    default_layout: ProcessorLayout = "legacy"
    # The class name the hub repos write (e.g. a torchvision "...Fast" class); None keeps transformers'.
    image_processor_type: str | None = None

    def save(self, directory: Path, layout: ProcessorLayout) -> None:
        whole = {**self.settings, "processor_class": self.processor_class}
        image_processor = self.image_processor.to_dict()
        if self.image_processor_type is not None:
            image_processor["image_processor_type"] = self.image_processor_type
        if layout == "nested":
            whole = {"image_processor": image_processor, **whole}
        else:
            if self.image_processor_type is None:
                self.image_processor.save_pretrained(directory)
            else:
                (directory / "preprocessor_config.json").write_text(json.dumps(image_processor, indent=2) + "\n")
            if not self.settings:
                return
        (directory / "processor_config.json").write_text(json.dumps(whole, indent=2, sort_keys=True) + "\n")


def fill_deterministic(model: torch.nn.Module) -> None:
    """Overwrite every parameter with values seeded by its name (stable across library versions)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            # transformers moved towers under "model." (4.52); the seed must not follow such moves.
            canonical = name.removeprefix("model.")
            seed = int.from_bytes(hashlib.blake2b(canonical.encode(), digest_size=8).digest(), "little")
            values = np.asarray(
                np.random.default_rng(seed).standard_normal(tuple(param.shape), dtype=np.float32), dtype=np.float32
            )
            if param.ndim == 1 and ("norm" in name or name.endswith("ln_1.weight")):
                values = 1.0 + 0.1 * values  # norm scales around one keep activations alive
            elif param.ndim == 1:
                values = 0.02 * values
            else:
                values = values / np.sqrt(max(1, int(np.prod(param.shape[1:]))))
            param.copy_(torch.as_tensor(values, dtype=torch.float32))


def _qwen2_vl(layout: Layout, processor_merge_size: int) -> tuple[PreTrainedModel, TinyProcessor]:
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
            text_config={**_TEXT, "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}}, vision_config=vision
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


def _qwen3_vl(layout: Layout, processor_merge_size: int) -> tuple[PreTrainedModel, TinyProcessor]:
    if layout != "full":
        raise ValueError("Qwen3-VL checkpoints only come as full VLMs")
    text = {
        **_TEXT,
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
    model = Qwen3VLForConditionalGeneration(Qwen3VLConfig(text_config=text, vision_config=vision, **_QWEN3_TOKENS))
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


def _qwen3_5(layout: Layout, processor_merge_size: int) -> tuple[PreTrainedModel, TinyProcessor]:
    if layout != "full":
        raise ValueError("Qwen3.5 checkpoints only come as full VLMs")
    text = {
        **_TEXT,
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
    model = Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=text, vision_config=vision, **_QWEN3_TOKENS))
    processor = Qwen2VLImageProcessorPil(
        size={"shortest_edge": 64 * 64, "longest_edge": 32 * 32 * 64},
        patch_size=16,
        temporal_patch_size=2,
        merge_size=processor_merge_size,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    return model, TinyProcessor(processor, "Qwen3VLProcessor", {}, "nested", "Qwen2VLImageProcessorFast")


def _gemma3(layout: Layout, _: int) -> tuple[PreTrainedModel, TinyProcessor]:
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
        text_config={**_TEXT, "head_dim": 32},
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


def _glm4v(layout: Layout, processor_merge_size: int) -> tuple[PreTrainedModel, TinyProcessor]:
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
    config = Glm4vConfig(text_config={**_TEXT, "rope_parameters": rope}, vision_config=vision, **tokens)
    model: PreTrainedModel = Glm4vForConditionalGeneration(config)
    # Settings the class reads but does not declare as typed kwargs.
    grid: dict[str, Any] = {"patch_size": 14, "temporal_patch_size": 2, "merge_size": processor_merge_size}
    processor = Glm4vImageProcessorPil(size={"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 64}, **grid)
    return model, TinyProcessor(processor, "Glm4vProcessor", {}, "nested")


def _idefics3(layout: Layout, _: int, *, smolvlm: bool = False) -> tuple[PreTrainedModel, TinyProcessor]:
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
    text = {**_TEXT, "model_type": "llama"}
    # 8x8 patches per 64-pixel view, pixel-shuffled by 2: 16 rows per view.
    settings: dict[str, Any] = {"image_seq_len": 16}
    sizes: dict[str, Any] = {"size": {"longest_edge": 128}, "max_image_size": {"longest_edge": 64}}
    if smolvlm:
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


def _smolvlm(layout: Layout, merge: int) -> tuple[PreTrainedModel, TinyProcessor]:
    return _idefics3(layout, merge, smolvlm=True)


def _mistral3(layout: Layout, _: int) -> tuple[PreTrainedModel, TinyProcessor]:
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
        text_config={**_TEXT, "head_dim": 32}, vision_config=vision, spatial_merge_size=2, image_token_index=5
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


def _llava_onevision(layout: Layout, _: int) -> tuple[PreTrainedModel, TinyProcessor]:
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
        text_config={**_TEXT, "model_type": "qwen2"},
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


def _llava_next(layout: Layout, _: int) -> tuple[PreTrainedModel, TinyProcessor]:
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
        text_config={**_TEXT, "model_type": "qwen2"},
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
        image_mean=_CLIP_MEAN,
        image_std=_CLIP_STD,
    )
    settings = {
        "patch_size": 8,
        "num_additional_image_tokens": 1,
        "vision_feature_select_strategy": "default",
        "image_token": "<image>",
    }
    return model, TinyProcessor(processor, "LlavaNextProcessor", settings, "nested")


def _siglip(layout: Layout, _: int) -> tuple[PreTrainedModel, TinyProcessor]:
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


def _clip(layout: Layout, _: int) -> tuple[PreTrainedModel, TinyProcessor]:
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
        size={"shortest_edge": 64}, crop_size={"height": 64, "width": 64}, image_mean=_CLIP_MEAN, image_std=_CLIP_STD
    )
    return model, TinyProcessor(processor, "CLIPProcessor")


def _internvl(layout: Layout, _: int, *, qkv_bias: bool = False) -> tuple[PreTrainedModel, TinyProcessor]:
    if layout != "full":
        raise ValueError("InternVL checkpoints only come as full VLMs (tower + projector + language model)")
    vision = InternVLVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=[64, 64],
        patch_size=[8, 8],
        attention_bias=qkv_bias,
    )
    config = InternVLConfig(
        vision_config=vision.to_dict(), text_config=Qwen2Config(**_TEXT).to_dict(), downsample_ratio=0.5
    )
    model: PreTrainedModel = InternVLForConditionalGeneration(config)
    processor = GotOcr2ImageProcessorPil(
        size={"height": 64, "width": 64},
        crop_to_patches=True,
        min_patches=1,
        max_patches=6,
        image_mean=_IMAGENET_MEAN,
        image_std=_IMAGENET_STD,
    )
    return model, TinyProcessor(processor, "InternVLProcessor")


def _internvl_chat(layout: Layout, merge: int) -> tuple[PreTrainedModel, TinyProcessor]:
    # Built as transformers' InternVL (with the qkv biases InternViT has), rewritten into OpenGVLab's
    # layout by to_opengvlab_layout after saving.
    return _internvl(layout, merge, qkv_bias=True)


def to_opengvlab_layout(directory: Path) -> None:
    """Rewrite a transformers InternVL save into the layout of OpenGVLab's InternVL2/2.5/3 repos."""
    from models.internvl import opengvlab_key

    tensors = load_file(str(directory / "model.safetensors"))
    fused: dict[str, dict[int, torch.Tensor]] = {}
    converted: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        inner = name.removeprefix("model.")
        if inner.startswith(("vision_tower.", "multi_modal_projector.")):
            key, part = opengvlab_key(inner)
            if part is None:
                converted[key] = tensor
            else:
                fused.setdefault(key, {})[part] = tensor
        elif inner.startswith("language_model."):
            converted["language_model.model." + inner.removeprefix("language_model.")] = tensor
        else:
            converted["language_model." + name] = tensor  # lm_head
    for key, parts in fused.items():
        converted[key] = torch.cat([parts[i] for i in range(3)])
    save_file(converted, str(directory / "model.safetensors"), metadata={"format": "pt"})

    config = json.loads((directory / "config.json").read_text())
    vision, text = config["vision_config"], config["text_config"]
    processor = json.loads((directory / "preprocessor_config.json").read_text())
    chat = {
        "architectures": ["InternVLChatModel"],
        "model_type": "internvl_chat",
        "template": "internvl2_5",
        "downsample_ratio": config["downsample_ratio"],
        "select_layer": config["vision_feature_layer"],
        "ps_version": "v2",
        "force_image_size": vision["image_size"][0],
        "dynamic_image_size": True,
        "use_thumbnail": True,
        "min_dynamic_patch": processor["min_patches"],
        "max_dynamic_patch": processor["max_patches"],
        "vision_config": {
            "model_type": "intern_vit_6b",
            "hidden_size": vision["hidden_size"],
            "intermediate_size": vision["intermediate_size"],
            "num_hidden_layers": vision["num_hidden_layers"],
            "num_attention_heads": vision["num_attention_heads"],
            "image_size": vision["image_size"][0],
            "patch_size": vision["patch_size"][0],
            "qkv_bias": vision["attention_bias"],
            "qk_normalization": vision["use_qk_norm"],
            "norm_type": vision["norm_type"],
            "layer_norm_eps": vision["layer_norm_eps"],
            "hidden_act": vision["hidden_act"],
        },
        "llm_config": {**text, "architectures": ["Qwen2ForCausalLM"]},
    }
    (directory / "config.json").write_text(json.dumps(chat, indent=2) + "\n")
    # The repos ship a CLIP preprocessor config their own code does not use.
    side = vision["image_size"][0]
    clip = {"crop_size": side, "size": side, "do_center_crop": True, "do_normalize": True, "do_resize": True}
    clip.update(feature_extractor_type="CLIPFeatureExtractor", image_mean=_IMAGENET_MEAN, image_std=_IMAGENET_STD)
    (directory / "preprocessor_config.json").write_text(json.dumps(clip, indent=2) + "\n")


FAMILIES: dict[str, Callable[[Layout, int], tuple[PreTrainedModel, TinyProcessor]]] = {
    "qwen2_vl": _qwen2_vl,
    "qwen3_vl": _qwen3_vl,
    "qwen3_5": _qwen3_5,
    "gemma3": _gemma3,
    "glm4v": _glm4v,
    "idefics3": _idefics3,
    "smolvlm": _smolvlm,
    "mistral3": _mistral3,
    "llava_onevision": _llava_onevision,
    "llava_next": _llava_next,
    "siglip": _siglip,
    "clip": _clip,
    "internvl": _internvl,
    "internvl_chat": _internvl_chat,
}


def build_tiny(
    directory: Path | str,
    family: str = "qwen2_vl",
    *,
    layout: Layout = "full",
    processor_merge_size: int = 2,
    processor_layout: ProcessorLayout | None = None,
    max_shard_size: str | None = None,
) -> Path:
    """Write a tiny checkpoint of ``family`` to ``directory`` (replaced atomically) and return it.

    ``processor_layout`` defaults to the family's own (``nested`` for families added with
    transformers 5); ``max_shard_size`` (e.g. ``"20KB"``) writes sharded safetensors with an index.
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; choose from {sorted(FAMILIES)}")
    directory = Path(directory)
    torch.manual_seed(0)  # construction-time init is overwritten below; this only keeps it quiet
    model, processor = FAMILIES[family](layout, processor_merge_size)
    fill_deterministic(model)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
    hf_logging.disable_progress_bar()
    try:
        if max_shard_size is None:
            model.save_pretrained(staging)
        else:
            model.save_pretrained(staging, max_shard_size=max_shard_size)
        processor.save(staging, processor_layout or processor.default_layout)
        if family == "internvl_chat":
            to_opengvlab_layout(staging)
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(staging, directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return directory
