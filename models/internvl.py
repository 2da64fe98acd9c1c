"""Crop-based: InternVL (tiles plus a thumbnail, as Step3-VL does with its crops).

``GotOcr2ImageProcessor`` with ``crop_to_patches`` cuts each image into ``num_patches`` tiles
(thumbnail included); every tile goes through the vision tower, a pixel shuffle and the projector and
yields the same number of rows, so an image yields ``num_patches * rows_per_tile`` rows. A
precomputed item cannot be checked without ``num_patches``: it is mandatory metadata here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from PIL import Image
from transformers import AutoModel, GotOcr2ImageProcessorPil, InternVLConfig, InternVLVisionConfig, Qwen2Config
from transformers.models.internvl.modeling_internvl import InternVLMultiModalProjector

from mmencode.models.base import EncoderAdapter, EncoderOutput, PreparedItem
from mmencode.models.errors import CheckpointError
from mmencode.models.processor_config import ProcessorConfig
from mmencode.models.weights import FusedQKV, KeyMap, load_config_json, renamed


class InternVLEncoder(torch.nn.Module):
    """The vision half of ``InternVLModel``: tower, pixel shuffle, projector; no language model."""

    def __init__(self, config: InternVLConfig) -> None:
        super().__init__()
        self.config = config
        # Same attribute names as InternVLModel, so checkpoint keys map one to one under "model.".
        self.vision_tower = AutoModel.from_config(config.vision_config)
        self.multi_modal_projector = InternVLMultiModalProjector(config)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        layer = self.config.vision_feature_layer
        if layer == -1:
            features = self.vision_tower(pixel_values=pixel_values).last_hidden_state
        else:
            outputs = self.vision_tower(pixel_values=pixel_values, output_hidden_states=True)
            features = outputs.hidden_states[layer]
        if self.config.vision_feature_select_strategy == "default":
            features = features[:, 1:, :]  # drop the class token
        tiles, positions, channels = features.shape
        side = int(positions**0.5)
        features = self._pixel_shuffle(features.reshape(tiles, side, side, channels))
        projected: torch.Tensor = self.multi_modal_projector(features.reshape(tiles, -1, features.shape[-1]))
        return projected

    def _pixel_shuffle(self, features: torch.Tensor) -> torch.Tensor:
        # Fold each (1/ratio x 1/ratio) neighbourhood into the channels, as InternVLModel.pixel_shuffle.
        scale = self.config.downsample_ratio
        tiles, width, height, channels = features.shape
        features = features.view(tiles, width, int(height * scale), int(channels / scale))
        features = features.permute(0, 2, 1, 3).contiguous()
        features = features.view(tiles, int(height * scale), int(width * scale), int(channels / scale**2))
        return features.permute(0, 2, 1, 3).contiguous()


class InternVLAdapter(EncoderAdapter):
    family = "internvl"
    required_metadata = ("num_patches",)
    tower_class: ClassVar[type[torch.nn.Module]] = InternVLEncoder
    processor_class: ClassVar[type] = GotOcr2ImageProcessorPil
    weight_prefixes: ClassVar[tuple[str, ...]] = ("model.", "")

    @property
    def hidden_size(self) -> int:
        return int(self.config.text_config.hidden_size)

    @property
    def rows_per_tile(self) -> int:
        # As InternVLProcessor's image_seq_length: patches per tile after the pixel shuffle.
        vision = self.config.vision_config
        patches = (vision.image_size[0] // vision.patch_size[0]) * (vision.image_size[1] // vision.patch_size[1])
        return int(patches * self.config.downsample_ratio**2)

    def preprocess(self, image: Image.Image) -> PreparedItem:
        # InternVLProcessor always asks for tiles (the image processor's own default is off); an
        # OpenGVLab config may turn dynamic tiling off (dynamic_image_size).
        crop = bool(self.processor_config.processor.get("crop_to_patches", True))
        out = self.processor(images=[image], crop_to_patches=crop, return_tensors="pt")
        num_patches = int(out["num_patches"][0])
        return PreparedItem(
            tensors={"pixel_values": out["pixel_values"]},
            metadata={"num_patches": num_patches},
            num_tokens=num_patches * self.rows_per_tile,
        )

    def tokens_from_metadata(self, metadata: Mapping[str, Any]) -> int:
        return self._int_field(metadata, "num_patches") * self.rows_per_tile

    def _forward(self, batch: dict[str, torch.Tensor], items: Sequence[PreparedItem]) -> EncoderOutput:
        tiles = self.module(batch["pixel_values"])
        count, rows, width = tiles.shape
        per_item = [item.metadata["num_patches"] * rows for item in items]
        return EncoderOutput(rows=tiles.reshape(count * rows, width), rows_per_item=per_item)


# ----- OpenGVLab's own layout: model_type "internvl_chat" (InternVL2 / 2.5 / 3 repos) -----

_IMAGENET_MEAN = [0.485, 0.456, 0.406]
_IMAGENET_STD = [0.229, 0.224, 0.225]
# Module tensor name fragments -> OpenGVLab's (InternVisionModel / InternVLChatModel) names.
_RENAMES = (
    (".embeddings.cls_token", ".embeddings.class_embedding"),
    (".embeddings.position_embeddings", ".embeddings.position_embedding"),
    (".embeddings.patch_embeddings.projection.", ".embeddings.patch_embedding."),
    (".lambda_1", ".ls1"),
    (".lambda_2", ".ls2"),
    (".attention.projection_layer.", ".attn.proj."),
    (".attention.q_norm.", ".attn.q_norm."),
    (".attention.k_norm.", ".attn.k_norm."),
    (".layernorm_before.", ".norm1."),
    (".layernorm_after.", ".norm2."),
)
_PROJECTOR = (("layer_norm.", "mlp1.0."), ("linear_1.", "mlp1.1."), ("linear_2.", "mlp1.3."))
_FUSED_QKV = FusedQKV(re.compile(r"\.attention\.([qkv])_proj\.(weight|bias)$"), ".attn.qkv.{kind}")


def opengvlab_key(name: str) -> tuple[str, int | None]:
    """Where a tensor of :class:`InternVLEncoder` sits in an OpenGVLab checkpoint, and which third of
    the fused ``attn.qkv`` it is (the same renames transformers applies when it converts these repos)."""
    if name.startswith("multi_modal_projector."):
        rest = name.removeprefix("multi_modal_projector.")
        for ours, theirs in _PROJECTOR:
            if rest.startswith(ours):
                return theirs + rest.removeprefix(ours), None
        return "mlp1." + rest, None
    key = "vision_model." + name.removeprefix("vision_tower.")
    key = re.sub(r"\.encoder\.layer\.(\d+)\.", r".encoder.layers.\1.", key)
    return _FUSED_QKV.locate(renamed(key, _RENAMES))


class InternVLChatAdapter(InternVLAdapter):
    """InternVL as OpenGVLab ships it: ``vision_model.*`` (fused qkv) and ``mlp1.*`` keys, settings in
    config.json (``force_image_size``, ``downsample_ratio``, ``select_layer``, ``max_dynamic_patch``...),
    and ``dynamic_preprocess`` tiling, which GotOcr2's ``crop_to_patches`` reproduces (aspect-ratio
    grid of ``min..max_dynamic_patch`` tiles, plus a thumbnail when there is more than one)."""

    key_maps = (KeyMap(roots=("vision_model.", "mlp1."), source=opengvlab_key, name="OpenGVLab layout"),)

    @classmethod
    def load_config(cls, checkpoint: Path) -> Any:
        raw: dict[str, Any] = load_config_json(checkpoint)
        vision, llm = raw.get("vision_config"), raw.get("llm_config")
        if not isinstance(vision, dict) or not isinstance(llm, dict):
            raise CheckpointError(f"{checkpoint}/config.json: internvl_chat needs vision_config and llm_config")
        if raw.get("ps_version", "v2") != "v2":
            raise CheckpointError(f"{checkpoint}: pixel shuffle {raw['ps_version']!r} is not supported (only v2)")
        size = int(raw.get("force_image_size") or vision["image_size"])
        patch = int(vision["patch_size"])
        tower = InternVLVisionConfig(
            hidden_size=vision["hidden_size"],
            intermediate_size=vision["intermediate_size"],
            num_hidden_layers=vision["num_hidden_layers"],
            num_attention_heads=vision["num_attention_heads"],
            image_size=[size, size],
            patch_size=[patch, patch],
            attention_bias=bool(vision.get("qkv_bias", True)),
            use_qk_norm=bool(vision.get("qk_normalization", False)),
            norm_type=vision.get("norm_type", "layer_norm"),
            layer_norm_eps=float(vision.get("layer_norm_eps", 1e-6)),
            hidden_act=vision.get("hidden_act", "gelu"),
            use_mean_pooling=True,  # InternViT has no final norm
        )
        # Only the language width matters here: the projector maps onto it.
        text = Qwen2Config(hidden_size=int(llm["hidden_size"]))
        return InternVLConfig(
            vision_config=tower.to_dict(),
            text_config=text.to_dict(),
            downsample_ratio=float(raw.get("downsample_ratio", 0.5)),
            vision_feature_layer=int(raw.get("select_layer", -1)),
            vision_feature_select_strategy="default",  # OpenGVLab drops the class token
        )

    @classmethod
    def load_processor_config(cls, checkpoint: Path, config: Any) -> ProcessorConfig:
        # The repos' preprocessor_config.json (a CLIP processor) is not what their code runs: the
        # tiling settings live in config.json, which the fingerprint already covers.
        raw: dict[str, Any] = load_config_json(checkpoint)
        dynamic = bool(raw.get("dynamic_image_size", True))
        if dynamic and not raw.get("use_thumbnail", True):
            raise CheckpointError(
                f"{checkpoint}: dynamic tiling without a thumbnail (use_thumbnail false) is not supported"
            )
        size = int(config.vision_config.image_size[0])
        image_processor = {
            "size": {"height": size, "width": size},
            "crop_to_patches": dynamic,
            "min_patches": int(raw.get("min_dynamic_patch", 1)),
            "max_patches": int(raw.get("max_dynamic_patch", 12)),
            "image_mean": _IMAGENET_MEAN,
            "image_std": _IMAGENET_STD,
            "resample": 3,  # bicubic, as OpenGVLab's transform
        }
        return ProcessorConfig(image_processor, {"crop_to_patches": dynamic}, ())
