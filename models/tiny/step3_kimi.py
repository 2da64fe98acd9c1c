"""Tiny Step3 (``step3p7``) and Kimi (``kimi_k25``) VLMs.

Their image processors exist only on transformers' torchvision backend, so the processor settings
are written as the plain dictionary ``ImageProcessor.to_dict()`` gives (checked against the real
class where torchvision imports): ``make-tiny`` builds these checkpoints on any machine, and only
serving them needs torchvision.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from transformers import (
    Kimi_K25Config,
    Kimi_K25ForConditionalGeneration,
    PreTrainedModel,
    Step3p7Config,
    Step3p7ForConditionalGeneration,
)

from mmencode.models.tiny.common import CLIP_MEAN, CLIP_STD, Layout, TinyProcessor

__all__ = ["KIMI_PROCESSOR", "STEP3_PROCESSOR", "kimi_k25", "step3p7"]

RESCALE = 1 / 255
# Step3p7ImageProcessor's settings, scaled down: a 168 px global view and 112 px crops, which the
# tower (ViT patch 14, two stride-2 convolutions: 56 px per row) turns into 9 and 4 rows.
STEP3_PROCESSOR: dict[str, Any] = {
    "image_processor_type": "Step3p7ImageProcessor",
    "size": {"height": 168, "width": 168},
    "patch_size": 112,
    "max_image_size": 3024,
    "do_convert_rgb": True,
    "resample": 2,  # bilinear
    "do_rescale": True,
    "rescale_factor": RESCALE,
    "do_normalize": True,
    "image_mean": CLIP_MEAN,
    "image_std": CLIP_STD,
}
# Kimi_K25ImageProcessor's defaults, with a patch budget small enough that larger images shrink.
KIMI_PROCESSOR: dict[str, Any] = {
    "image_processor_type": "Kimi_K25ImageProcessor",
    "size": {"max_height": 512, "max_width": 512},
    "max_patches": 200,
    "patch_size": 14,
    "merge_size": 2,
    "do_convert_rgb": True,
    "do_resize": True,
    "resample": 3,  # bicubic
    "do_rescale": True,
    "rescale_factor": RESCALE,
    "do_normalize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}


@dataclass(frozen=True)
class ImageProcessorSettings:
    """An image processor's saved settings, for :class:`TinyProcessor` (which calls ``to_dict``)."""

    settings: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.settings)


def step3p7(layout: Layout, _: int) -> tuple[PreTrainedModel, TinyProcessor]:
    if layout != "full":
        raise ValueError("Step3 checkpoints only come as full VLMs (tower + projector + language model)")
    text = {
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "max_position_embeddings": 128,
        "n_routed_experts": 2,
        "num_experts_per_tok": 1,
        "moe_intermediate_size": 32,
        "share_expert_dim": 32,
        "mlp_layer_types": ["dense"],
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    vision = {
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "mlp_ratio": 2.0,
        "image_size": 168,
        "patch_size": 14,
    }
    config = Step3p7Config(vision_config=vision, text_config=text, image_token_id=10)
    model: PreTrainedModel = Step3p7ForConditionalGeneration(config)
    processor = TinyProcessor(ImageProcessorSettings(STEP3_PROCESSOR), "Step3p7Processor", default_layout="nested")
    return model, processor


def kimi_k25(layout: Layout, _: int) -> tuple[PreTrainedModel, TinyProcessor]:
    if layout != "full":
        raise ValueError("Kimi checkpoints only come as full VLMs (tower + projector + language model)")
    text = {
        "model_type": "deepseek_v3",
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "n_routed_experts": 2,
        "num_experts_per_tok": 1,
        "n_group": 1,
        "topk_group": 1,
        "first_k_dense_replace": 1,
        "q_lora_rank": 16,
        "kv_lora_rank": 16,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 8,
        "v_head_dim": 16,
        "max_position_embeddings": 128,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    vision = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "patch_size": 14,
        "pos_emb_height": 8,
        "pos_emb_width": 8,
        "pos_emb_time": 4,
        "merge_kernel_size": [2, 2],
    }
    config = Kimi_K25Config(
        text_config=text,
        vision_config=vision,
        projection_hidden_size=32,
        image_token_id=10,
        video_token_id=11,
        vision_start_token_id=12,
        vision_end_token_id=13,
    )
    model: PreTrainedModel = Kimi_K25ForConditionalGeneration(config)
    processor = TinyProcessor(ImageProcessorSettings(KIMI_PROCESSOR), "Kimi_K25Processor", default_layout="nested")
    return model, processor
