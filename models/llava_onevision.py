"""LLaVA-OneVision: any-resolution tiling, unpadding and learned newline rows.

The image processor picks the best grid from ``image_grid_pinpoints`` for the image's original size,
cuts it into tiles of the tower's input size and puts the whole image, resized to one tile, first.
Every tile goes through the SigLIP tower and the projector; the model then lays the grid tiles' rows
out as one feature map, removes the rows and columns that are padding for this aspect ratio,
shrinks the map when it is larger than ``anyres_max_N`` tiles, and appends its learned
``image_newline`` embedding after every row of the map. The rows of an image are the base tile's
rows, then the unpadded map with its newlines, exactly as ``LlavaOnevisionModel.pack_image_features``
builds them (it is called here); ``num_tokens`` is ``LlavaOnevisionProcessor``'s count.

``image_sizes`` (the original ``[height, width]``) is the metadata a precomputed item must carry. The
rows are those of an image alone in its prompt: with several images in one prompt, transformers uses
only each image's base tile, a prompt-level choice an encoder service cannot see.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from PIL import Image
from transformers import AutoModel, LlavaOnevisionConfig, LlavaOnevisionImageProcessorPil
from transformers.image_processing_utils import select_best_resolution
from transformers.models.llava_onevision.modeling_llava_onevision import (
    LlavaOnevisionModel,
    LlavaOnevisionMultiModalProjector,
)

from mmencode.models.base import EncoderAdapter, EncoderOutput, PreparedItem
from mmencode.models.weights import transformers4_layout

_SIZES = "image_sizes"


def unpadded_grid(height: int, width: int, grid_height: int, grid_width: int) -> tuple[int, int]:
    """The any-resolution feature map without the rows or columns that only padding covers, as the
    LLaVA-NeXT / OneVision models unpad it (``unpad_image``, rounded as they round)."""
    if width / height > grid_width / grid_height:
        padding = (grid_height - int(round(height * (grid_width / width), 7))) // 2
        return grid_height - 2 * padding, grid_width
    padding = (grid_width - int(round(width * (grid_height / height), 7))) // 2
    return grid_height, grid_width - 2 * padding


class LlavaOnevisionEncoder(torch.nn.Module):
    """The vision half of ``LlavaOnevisionModel``: tower, projector and newline; no language model."""

    def __init__(self, config: LlavaOnevisionConfig) -> None:
        super().__init__()
        self.config = config
        # Same attribute names as LlavaOnevisionModel, so checkpoint keys map one to one under "model.".
        self.vision_tower = AutoModel.from_config(config.vision_config)
        self.multi_modal_projector: torch.nn.Module = LlavaOnevisionMultiModalProjector(config)
        text: Any = config.text_config
        self.image_newline = torch.nn.Parameter(torch.zeros(text.hidden_size))

    def forward(
        self, pixel_values: torch.Tensor, image_sizes: torch.Tensor, tiles: list[int]
    ) -> tuple[torch.Tensor, list[int]]:
        outputs = self.vision_tower(pixel_values, output_hidden_states=True)
        layer = self.config.vision_feature_layer
        layers = [layer] if isinstance(layer, int) else list(layer)
        selected = torch.cat([outputs.hidden_states[i] for i in layers], dim=-1)
        if self.config.vision_feature_select_strategy == "default":
            selected = selected[:, 1:]  # drop the class token
        features = torch.split(self.multi_modal_projector(selected), tiles)
        packed, lengths = self.pack(features, image_sizes)
        return torch.cat(packed), [int(n) for n in lengths]

    def pack(self, features: Sequence[torch.Tensor], image_sizes: torch.Tensor) -> tuple[list[torch.Tensor], Any]:
        # The model's own packing (grid layout, unpadding, anyres_max shrinking, newlines); it reads
        # only self.config, which this module shares with LlavaOnevisionModel.
        packed, lengths = LlavaOnevisionModel.pack_image_features(
            self,  # type: ignore[arg-type]
            features,
            image_sizes,
            image_newline=self.image_newline,
            vision_aspect_ratio=self.config.vision_aspect_ratio,
        )
        return packed, lengths


class LlavaOnevisionAdapter(EncoderAdapter):
    family = "llava_onevision"
    required_metadata = (_SIZES,)
    tower_class: ClassVar[type[torch.nn.Module]] = LlavaOnevisionEncoder
    processor_class: ClassVar[type] = LlavaOnevisionImageProcessorPil
    weight_prefixes: ClassVar[tuple[str, ...]] = ("model.", "")
    # The llava-hf repos, saved by transformers 4: vision_tower.vision_model.*, image_newline at the root.
    key_maps = (transformers4_layout("multi_modal_projector.", "image_newline"),)

    @property
    def hidden_size(self) -> int:
        return int(self.config.text_config.hidden_size)

    def _setting(self, name: str, default: Any) -> Any:
        return self.processor_config.setting(name, default)

    def count_rows(self, height: int, width: int) -> int:
        """Placeholders for an image of original size (height, width), as LlavaOnevisionProcessor counts."""
        vision = self.config.vision_config
        default_tokens = (vision.image_size // vision.patch_size) ** 2
        num_image_tokens = int(self._setting("num_image_tokens", default_tokens))
        strategy = self._setting("vision_feature_select_strategy", self.config.vision_feature_select_strategy)
        aspect = str(self._setting("vision_aspect_ratio", self.config.vision_aspect_ratio))
        tile_height, tile_width = int(self.processor.size["height"]), int(self.processor.size["width"])

        best_height, best_width = select_best_resolution((height, width), self.processor.image_grid_pinpoints)
        side = int(math.sqrt(num_image_tokens))
        grid_height, grid_width = side * (best_height // tile_height), side * (best_width // tile_width)
        # Unpadding: the map keeps the rows/columns the image covers at this aspect ratio.
        grid_height, grid_width = unpadded_grid(height, width, grid_height, grid_width)
        unpadded, newlines = grid_height * grid_width, grid_height
        ratio = math.sqrt(grid_height * grid_width / (int(aspect.removeprefix("anyres_max_")) * side**2))
        if ratio > 1.1:  # shrunk to about anyres_max_N tiles
            unpadded = int(grid_height // ratio) * int(grid_width // ratio)
            newlines = int(grid_height // ratio)
        rows = num_image_tokens + unpadded + newlines
        return rows - 1 if strategy == "default" else rows

    def preprocess(self, image: Image.Image) -> PreparedItem:
        out = self.processor(images=[image], return_tensors="pt")
        height, width = (int(v) for v in out["image_sizes"][0])
        return PreparedItem(
            tensors={"pixel_values": out["pixel_values"][0], "image_sizes": out["image_sizes"]},
            metadata={_SIZES: [height, width]},
            num_tokens=self.count_rows(height, width),
        )

    def tokens_from_metadata(self, metadata: Mapping[str, Any]) -> int:
        return self.count_rows(*self._int_list(metadata, _SIZES, ("height", "width")))

    def _forward(self, batch: dict[str, torch.Tensor], items: Sequence[PreparedItem]) -> EncoderOutput:
        tiles = [int(item.tensors["pixel_values"].shape[0]) for item in items]
        rows, lengths = self.module(batch["pixel_values"], batch["image_sizes"], tiles)
        return EncoderOutput(rows=rows, rows_per_item=lengths)
