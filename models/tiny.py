"""Deterministic tiny checkpoints of every family, in the layouts users download.

Weights are drawn per tensor from a generator seeded by the tensor's name, so a checkpoint is the same
on every torch/transformers version whatever order layers are constructed in. The result is a normal
``save_pretrained`` directory (config, safetensors, preprocessor config) loaded by the same path as a
real model. Full-VLM layouts include a (tiny) language model that the service must never load.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from transformers import (
    CLIPConfig,
    CLIPImageProcessorPil,
    CLIPModel,
    CLIPVisionConfig,
    CLIPVisionModel,
    GotOcr2ImageProcessorPil,
    InternVLConfig,
    InternVLForConditionalGeneration,
    InternVLVisionConfig,
    PreTrainedModel,
    Qwen2Config,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
    Qwen2VLVisionConfig,
    SiglipConfig,
    SiglipImageProcessorPil,
    SiglipModel,
    SiglipVisionConfig,
    SiglipVisionModel,
)
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel
from transformers.utils import logging as hf_logging

__all__ = ["FAMILIES", "Layout", "build_tiny", "fill_deterministic"]

Layout = Literal["full", "vision"]

_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
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


def _qwen2_vl(layout: Layout, processor_merge_size: int) -> tuple[PreTrainedModel, Any]:
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
    return model, processor


def _siglip(layout: Layout, _: int) -> tuple[PreTrainedModel, Any]:
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
    return model, processor


def _clip(layout: Layout, _: int) -> tuple[PreTrainedModel, Any]:
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
    return model, processor


def _internvl(layout: Layout, _: int) -> tuple[PreTrainedModel, Any]:
    if layout != "full":
        raise ValueError("InternVL checkpoints only come as full VLMs (tower + projector + language model)")
    vision = InternVLVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=[64, 64],
        patch_size=[8, 8],
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
        image_mean=_CLIP_MEAN,
        image_std=_CLIP_STD,
    )
    return model, processor


FAMILIES: dict[str, Callable[[Layout, int], tuple[PreTrainedModel, Any]]] = {
    "qwen2_vl": _qwen2_vl,
    "siglip": _siglip,
    "clip": _clip,
    "internvl": _internvl,
}


def build_tiny(
    directory: Path | str,
    family: str = "qwen2_vl",
    *,
    layout: Layout = "full",
    processor_merge_size: int = 2,
    overwrite: bool = False,
) -> Path:
    """Write a tiny checkpoint of ``family`` to ``directory`` and return it.

    A directory that holds anything is refused (``FileExistsError``) unless ``overwrite``: it could be a
    real checkpoint. With ``overwrite`` it is replaced atomically.
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; choose from {sorted(FAMILIES)}")
    directory = Path(directory)
    if not overwrite and (directory.is_file() or (directory.is_dir() and any(directory.iterdir()))):
        raise FileExistsError(f"{directory} exists and is not empty")
    torch.manual_seed(0)  # construction-time init is overwritten below; this only keeps it quiet
    model, processor = FAMILIES[family](layout, processor_merge_size)
    fill_deterministic(model)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(staging)
        processor.save_pretrained(staging)
        _make_readable(staging)
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(staging, directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return directory


def _make_readable(directory: Path) -> None:
    """Modes of a downloaded checkpoint (755/644), not mkdtemp's 700: a container running as another
    user (the image's uid 10001) reads the directory through a read-only volume."""
    directory.chmod(0o755)
    for path in directory.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
