"""Tiny InternVL, in transformers' layout and in OpenGVLab's (``internvl_chat``)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import (
    GotOcr2ImageProcessorPil,
    InternVLConfig,
    InternVLForConditionalGeneration,
    InternVLVisionConfig,
    PreTrainedModel,
    Qwen2Config,
)

from mmencode.models.tiny.common import IMAGENET_MEAN, IMAGENET_STD, TEXT_CONFIG, Layout, TinyProcessor


def internvl(layout: Layout, _: int, *, qkv_bias: bool = False) -> tuple[PreTrainedModel, TinyProcessor]:
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
        vision_config=vision.to_dict(), text_config=Qwen2Config(**TEXT_CONFIG).to_dict(), downsample_ratio=0.5
    )
    model: PreTrainedModel = InternVLForConditionalGeneration(config)
    processor = GotOcr2ImageProcessorPil(
        size={"height": 64, "width": 64},
        crop_to_patches=True,
        min_patches=1,
        max_patches=6,
        image_mean=IMAGENET_MEAN,
        image_std=IMAGENET_STD,
    )
    return model, TinyProcessor(processor, "InternVLProcessor")


def internvl_chat(layout: Layout, merge: int) -> tuple[PreTrainedModel, TinyProcessor]:
    # Built as transformers' InternVL (with the qkv biases InternViT has), rewritten into OpenGVLab's
    # layout by to_opengvlab_layout after saving.
    return internvl(layout, merge, qkv_bias=True)


def to_opengvlab_layout(directory: Path) -> None:
    """Rewrite a transformers InternVL save into the layout of OpenGVLab's InternVL2/2.5/3 repos."""
    from mmencode.models.internvl import opengvlab_key

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
    clip.update(feature_extractor_type="CLIPFeatureExtractor", image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD)
    (directory / "preprocessor_config.json").write_text(json.dumps(clip, indent=2) + "\n")
