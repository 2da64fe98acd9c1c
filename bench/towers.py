"""Real-size vision towers with random weights, built from their published hyper-parameters.

Nothing is downloaded: each tower's transformers config is written here with the released model's
numbers, the module is built on the meta device (no init pass over hundreds of millions of weights),
filled with random values, and saved with its image processor as a ``save_pretrained`` directory that
``mmencode serve --model DIR`` loads through the normal path. ``tiny`` keeps each family's real image
processor (so rows per image are the real ones: 2,691 for a 1080p image on Qwen2.5-VL) with tiny depths
and widths, so the whole pipeline runs on a CPU in seconds.

- ``qwen2.5-vl-7b``: Qwen2.5-VL-7B-Instruct's tower: depth 32, width 1280, MLP 3420, 16 heads, rows of
  3584 (the merger's output), window attention of 112 px with full attention in blocks 7, 15, 23, 31.
- ``siglip-so400m``: siglip-so400m-patch14-384: 27 layers, width 1152, MLP 4304, 16 heads, 384 px.
- ``internvit-300m``: InternViT-300M-448px (24 layers, width 1024, MLP 4096, 16 heads, 448 px tiles)
  with InternVL3-8B's pixel shuffle and projector onto Qwen2.5-7B's width, 3584.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from transformers import (
    GotOcr2ImageProcessorPil,
    InternVLConfig,
    InternVLVisionConfig,
    PretrainedConfig,
    Qwen2_5_VLVisionConfig,
    Qwen2Config,
    Qwen2VLImageProcessorPil,
    SiglipImageProcessorPil,
    SiglipVisionConfig,
    SiglipVisionModel,
)
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

from mmencode.models.internvl import InternVLEncoder
from mmencode.models.tiny import TinyProcessor
from mmencode.models.tiny.common import CLIP_MEAN, CLIP_STD, IMAGENET_MEAN, IMAGENET_STD, replaced_atomically

__all__ = ["TOWERS", "Tower", "build_tower"]

_BICUBIC = 3
# How _fill_random draws weights: part of a built tower's spec, so a change rebuilds it.
_WEIGHTS = "normal(0, 0.02), norms at one, biases at zero"


@dataclass(frozen=True)
class Tower:
    name: str
    # Images per forward the bare phase tries (one image is 1-9 forward "rows" of very different cost).
    batch_sizes: tuple[int, ...]
    # (tiny) -> (config, module class or factory, processor); the config is what config.json holds.
    parts: Callable[[bool], tuple[PretrainedConfig, Callable[[Any], torch.nn.Module], TinyProcessor]]


def _qwen2_5_vl_7b(tiny: bool) -> tuple[PretrainedConfig, Callable[[Any], torch.nn.Module], TinyProcessor]:
    size: dict[str, Any] = {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16}
    size |= {"out_hidden_size": 3584, "fullatt_block_indexes": [7, 15, 23, 31]}
    if tiny:
        # Window attention only: one full-attention block over 10,764 patches costs seconds on a CPU.
        size = {"depth": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2}
        size |= {"out_hidden_size": 128, "fullatt_block_indexes": []}
    config = Qwen2_5_VLVisionConfig(
        **size, hidden_act="silu", patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112
    )
    # The released preprocessor_config.json: min_pixels 3136, max_pixels 12845056.
    processor = Qwen2VLImageProcessorPil(
        size={"shortest_edge": 3136, "longest_edge": 12845056},
        patch_size=14,
        temporal_patch_size=2,
        merge_size=2,
        image_mean=CLIP_MEAN,
        image_std=CLIP_STD,
    )
    return config, Qwen2_5_VisionTransformerPretrainedModel, TinyProcessor(processor, "Qwen2_5_VLProcessor")


def _siglip_so400m(tiny: bool) -> tuple[PretrainedConfig, Callable[[Any], torch.nn.Module], TinyProcessor]:
    size: dict[str, Any] = {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27}
    size["num_attention_heads"] = 16
    if tiny:
        size = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
    config = SiglipVisionConfig(
        **size, image_size=384, patch_size=14, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6
    )
    processor = SiglipImageProcessorPil(
        size={"height": 384, "width": 384}, resample=_BICUBIC, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )
    return config, SiglipVisionModel, TinyProcessor(processor, "SiglipProcessor")


def _internvit_300m(tiny: bool) -> tuple[PretrainedConfig, Callable[[Any], torch.nn.Module], TinyProcessor]:
    size: dict[str, Any] = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24}
    size["num_attention_heads"] = 16
    language_width = 3584  # Qwen2.5-7B, the language model of InternVL3-8B: the projector's output
    if tiny:
        size = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
        language_width = 64
    vision = InternVLVisionConfig(
        **size,
        image_size=[448, 448],
        patch_size=[14, 14],
        attention_bias=True,  # InternViT's qkv has biases
        use_qk_norm=False,
        norm_type="layer_norm",
        layer_norm_eps=1e-6,
        hidden_act="gelu",
        use_mean_pooling=True,
    )
    # mmencode's internvl adapter builds the projector from the full config: only the language width
    # of the text config matters (the language model itself is never built or saved).
    config = InternVLConfig(
        vision_config=vision.to_dict(),
        text_config=Qwen2Config(hidden_size=language_width).to_dict(),
        downsample_ratio=0.5,
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
    )
    # As InternVLProcessor runs it: aspect-ratio tiles of 448 px (1 to 12) plus a thumbnail.
    processor = GotOcr2ImageProcessorPil(
        size={"height": 448, "width": 448},
        crop_to_patches=True,
        min_patches=1,
        max_patches=12,
        resample=_BICUBIC,
        image_mean=IMAGENET_MEAN,
        image_std=IMAGENET_STD,
    )
    return config, InternVLEncoder, TinyProcessor(processor, "InternVLProcessor")


TOWERS: dict[str, Tower] = {
    "qwen2.5-vl-7b": Tower("qwen2.5-vl-7b", (1, 2, 4, 8), _qwen2_5_vl_7b),
    "siglip-so400m": Tower("siglip-so400m", (8, 32, 64, 128, 256), _siglip_so400m),
    "internvit-300m": Tower("internvit-300m", (1, 4, 8, 16, 32), _internvit_300m),
}


def _fill_random(module: torch.nn.Module, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Random parameters of sensible scale (the released init's: std 0.02, norms at one, biases at zero).

    Only parameters are returned (and saved): buffers of a meta-built module hold no values, and the
    ones a checkpoint may carry (position ids) are rebuilt from the config when the service loads it.
    """
    # LayerNorm, RMSNorm and the families' own norm classes: found by class, their names vary (ln_q, norm1).
    norms = {
        f"{prefix}.{name}" if prefix else name
        for prefix, child in module.named_modules()
        if "norm" in type(child).__name__.lower()
        for name, _ in child.named_parameters(recurse=False)
    }
    weights = {}
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name in norms:
                param.fill_(1.0 if name.endswith("weight") else 0.0)
            elif "lambda" in name:
                param.fill_(0.1)  # InternViT's layer scale
            elif name.endswith("bias"):
                param.zero_()
            else:
                param.normal_(0.0, 0.02, generator=generator)
            weights[name] = param.detach().contiguous()
    return weights


def build_tower(name: str, root: Path, *, tiny: bool = False, dtype: torch.dtype = torch.bfloat16) -> Path:
    """``root/<name>`` (``root/tiny-<name>``) as a checkpoint directory; reused when its spec is unchanged."""
    tower = TOWERS[name]
    config, module_class, processor = tower.parts(tiny)
    directory = root / (f"tiny-{name}" if tiny else name)
    spec = {"config": config.to_dict(), "processor": processor.image_processor.to_dict(), "dtype": str(dtype)}
    spec["weights"] = _WEIGHTS
    spec_text = json.dumps(spec, sort_keys=True, default=str)
    marker = directory / "bench-spec.json"
    if marker.is_file() and marker.read_text() == spec_text:
        return directory

    with torch.device("meta"):
        module = module_class(config)
    module = module.to_empty(device="cpu").to(dtype)
    weights = _fill_random(module, torch.Generator().manual_seed(0))
    with replaced_atomically(directory) as staging:
        config.save_pretrained(staging)
        save_file(weights, str(staging / "model.safetensors"), metadata={"format": "pt"})
        processor.save(staging, "legacy")
        (staging / "bench-spec.json").write_text(spec_text)
    return directory
