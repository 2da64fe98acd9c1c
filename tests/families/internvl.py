"""References for InternVL in OpenGVLab's layout."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch
from PIL import Image
from safetensors.torch import load_file, save_file
from transformers import (
    InternVLForConditionalGeneration,
    InternVLProcessor,
)

from mmencode.models import EncoderAdapter
from tests.families.common import FamilySpec, bare_processor

# ----- InternVL, OpenGVLab layout -----
# OpenGVLab -> transformers tensor names: the renames of transformers' own conversion
# (conversion_mapping.py, written independently of models/internvl.py's mapping the other way).
_TO_TRANSFORMERS = [
    (r"^vision_model\.", "model.vision_tower."),
    (r"\.encoder\.layers\.(\d+)\.", r".encoder.layer.\1."),
    (r"\.ls1$", ".lambda_1"),
    (r"\.ls2$", ".lambda_2"),
    (r"\.attn\.proj\.", ".attention.projection_layer."),
    (r"\.norm1\.", ".layernorm_before."),
    (r"\.norm2\.", ".layernorm_after."),
    (r"\.embeddings\.class_embedding$", ".embeddings.cls_token"),
    (r"\.embeddings\.position_embedding$", ".embeddings.position_embeddings"),
    (r"\.embeddings\.patch_embedding\.", ".embeddings.patch_embeddings.projection."),
    (r"^language_model\.model\.", "model.language_model."),
    (r"^language_model\.lm_head\.", "lm_head."),
    (r"^mlp1\.0\.", "model.multi_modal_projector.layer_norm."),
    (r"^mlp1\.1\.", "model.multi_modal_projector.linear_1."),
    (r"^mlp1\.3\.", "model.multi_modal_projector.linear_2."),
]


def opengvlab_to_transformers(src: Path, dst: Path) -> Path:
    """A transformers-layout InternVL checkpoint (config, weights, processor) from an OpenGVLab one."""
    dst.mkdir(parents=True)
    converted: dict[str, torch.Tensor] = {}
    for key, tensor in load_file(str(src / "model.safetensors")).items():
        for pattern, replacement in _TO_TRANSFORMERS:
            key = re.sub(pattern, replacement, key)
        if ".attn.qkv." in key:
            for part, chunk in zip("qkv", tensor.chunk(3), strict=True):
                converted[key.replace(".attn.qkv.", f".attention.{part}_proj.")] = chunk
        else:
            converted[key] = tensor
    save_file(converted, str(dst / "model.safetensors"), metadata={"format": "pt"})
    chat = json.loads((src / "config.json").read_text())
    vision = chat["vision_config"]
    config = {
        "model_type": "internvl",
        "architectures": ["InternVLForConditionalGeneration"],
        "downsample_ratio": chat["downsample_ratio"],
        "vision_feature_layer": chat["select_layer"],
        "vision_feature_select_strategy": "default",
        "vision_config": {
            "model_type": "internvl_vision",
            "hidden_size": vision["hidden_size"],
            "intermediate_size": vision["intermediate_size"],
            "num_hidden_layers": vision["num_hidden_layers"],
            "num_attention_heads": vision["num_attention_heads"],
            "image_size": [chat["force_image_size"]] * 2,
            "patch_size": [vision["patch_size"]] * 2,
            "attention_bias": vision["qkv_bias"],
            "use_qk_norm": vision["qk_normalization"],
            "norm_type": vision["norm_type"],
            "layer_norm_eps": vision["layer_norm_eps"],
        },
        "text_config": {**chat["llm_config"], "model_type": "qwen2"},
    }
    (dst / "config.json").write_text(json.dumps(config))
    side = chat["force_image_size"]
    processor = {
        "image_processor_type": "GotOcr2ImageProcessor",
        "size": {"height": side, "width": side},
        "crop_to_patches": True,
        "min_patches": chat["min_dynamic_patch"],
        "max_patches": chat["max_dynamic_patch"],
        "image_mean": [0.485, 0.456, 0.406],
        "image_std": [0.229, 0.224, 0.225],
        "resample": 3,
    }
    (dst / "preprocessor_config.json").write_text(json.dumps(processor))
    return dst


def _internvl_chat_reference(directory: Path, images: list[Image.Image], adapter: EncoderAdapter) -> list[torch.Tensor]:
    twin = opengvlab_to_transformers(directory, directory.parent / f"{directory.name}-as-transformers")
    try:
        inputs = adapter.processor(images=images, crop_to_patches=True, return_tensors="pt")
        model = InternVLForConditionalGeneration.from_pretrained(twin).eval()
        with torch.inference_mode():
            tiles = model.model.get_image_features(pixel_values=inputs["pixel_values"]).pooler_output
    finally:
        shutil.rmtree(twin)
    return [chunk.reshape(-1, chunk.shape[-1]) for chunk in torch.split(tiles, inputs["num_patches"].tolist())]


def _internvl_chat_placeholders(adapter: EncoderAdapter, image: Image.Image) -> int:
    # OpenGVLab's chat code: num_image_token = (image_size // patch_size) ** 2 * downsample_ratio ** 2
    # <IMG_CONTEXT> per tile; transformers' InternVLProcessor writes the same run per tile.
    chat = json.loads((adapter.checkpoint / "config.json").read_text())
    per_tile = int(
        (chat["force_image_size"] // chat["vision_config"]["patch_size"]) ** 2 * chat["downsample_ratio"] ** 2
    )
    processor = bare_processor(
        InternVLProcessor,
        image_seq_length=per_tile,
        image_token="<IMG_CONTEXT>",
        start_image_token="<img>",
        end_image_token="</img>",
    )
    inputs = adapter.processor(images=[image], crop_to_patches=True, return_tensors="pt")
    return str(processor.replace_image_token(inputs, 0)).count("<IMG_CONTEXT>")


SPECS: dict[str, FamilySpec] = {
    "internvl_chat": FamilySpec(
        "internvl_chat", ("num_patches",), _internvl_chat_reference, _internvl_chat_placeholders, None
    ),
}
