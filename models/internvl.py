"""Crop-based: InternVL (tiles plus a thumbnail, as Step3-VL does with its crops).

``GotOcr2ImageProcessor`` with ``crop_to_patches`` cuts each image into ``num_patches`` tiles
(thumbnail included); every tile goes through the vision tower, a pixel shuffle and the projector and
yields the same number of rows, so an image yields ``num_patches * rows_per_tile`` rows. A
precomputed item cannot be checked without ``num_patches``: it is mandatory metadata here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from PIL import Image
from transformers import AutoModel, GotOcr2ImageProcessorPil, InternVLConfig
from transformers.models.internvl.modeling_internvl import InternVLMultiModalProjector

from models.base import EncoderAdapter, EncoderOutput, PreparedImage


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

    def preprocess(self, image: Image.Image) -> PreparedImage:
        # InternVLProcessor always asks for tiles; the image processor's own default is off.
        out = self.processor(images=[image], crop_to_patches=True, return_tensors="pt")
        num_patches = int(out["num_patches"][0])
        return PreparedImage(
            tensors={"pixel_values": out["pixel_values"]},
            metadata={"num_patches": num_patches},
            num_tokens=num_patches * self.rows_per_tile,
        )

    def tokens_from_metadata(self, metadata: Mapping[str, Any]) -> int:
        return self._positive_int(metadata, "num_patches") * self.rows_per_tile

    def _forward(self, batch: dict[str, torch.Tensor], items: Sequence[PreparedImage]) -> EncoderOutput:
        tiles = self.module(batch["pixel_values"])
        count, rows, width = tiles.shape
        per_item = [item.metadata["num_patches"] * rows for item in items]
        return EncoderOutput(rows=tiles.reshape(count * rows, width), rows_per_item=per_item)
