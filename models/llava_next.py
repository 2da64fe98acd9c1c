"""LLaVA-NeXT (LLaVA 1.6): any-resolution tiling with unpadding and newline rows, as LLaVA-OneVision
but without its ``anyres_max`` shrinking, and usually on a CLIP tower whose class token is dropped.

An image yields the base tile's patches, then the grid's feature map unpadded to the image's aspect
ratio with the learned ``image_newline`` row after each of its rows, exactly as
``LlavaNextModel.pack_image_features`` builds them (called here); ``num_tokens`` is
``LlavaNextProcessor``'s count (``patch_size``, ``num_additional_image_tokens`` and
``vision_feature_select_strategy`` from processor_config.json). Metadata: ``image_sizes`` (original).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from transformers import LlavaNextConfig, LlavaNextImageProcessorPil
from transformers.image_processing_utils import select_best_resolution
from transformers.models.llava_next.modeling_llava_next import LlavaNextModel, LlavaNextMultiModalProjector

from mmencode.models.llava_onevision import LlavaOnevisionAdapter, LlavaOnevisionEncoder, unpadded_grid


class LlavaNextEncoder(LlavaOnevisionEncoder):
    """The vision half of ``LlavaNextModel``: tower, projector and newline; no language model."""

    def __init__(self, config: LlavaNextConfig) -> None:
        super().__init__(config)  # type: ignore[arg-type]
        self.multi_modal_projector = LlavaNextMultiModalProjector(config)

    def pack(self, features: Sequence[torch.Tensor], image_sizes: torch.Tensor) -> tuple[list[torch.Tensor], Any]:
        packed, lengths = LlavaNextModel.pack_image_features(
            self,  # type: ignore[arg-type]
            features,
            image_sizes,
            vision_feature_select_strategy=self.config.vision_feature_select_strategy,
            image_newline=self.image_newline,
        )
        return packed, lengths


class LlavaNextAdapter(LlavaOnevisionAdapter):
    family = "llava_next"
    tower_class: ClassVar[type[torch.nn.Module]] = LlavaNextEncoder
    processor_class: ClassVar[type] = LlavaNextImageProcessorPil

    def count_rows(self, height: int, width: int) -> int:
        """Placeholders for an image of original size (height, width), as LlavaNextProcessor counts."""
        vision = self.config.vision_config
        patch = int(self._setting("patch_size", vision.patch_size))
        additional = int(self._setting("num_additional_image_tokens", 0))
        strategy = self._setting("vision_feature_select_strategy", self.config.vision_feature_select_strategy)
        tile_height, tile_width = int(self.processor.crop_size["height"]), int(self.processor.crop_size["width"])

        best_height, best_width = select_best_resolution((height, width), self.processor.image_grid_pinpoints)
        side_height, side_width = tile_height // patch, tile_width // patch
        grid_height = side_height * (best_height // tile_height)
        grid_width = side_width * (best_width // tile_width)
        grid_height, grid_width = unpadded_grid(height, width, grid_height, grid_width)
        rows = grid_height * grid_width + grid_height + side_height * side_width + additional
        return rows - 1 if strategy == "default" else rows
