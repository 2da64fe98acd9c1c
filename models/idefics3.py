"""Idefics3 and SmolVLM: the image split into a grid of crops plus a global view.

The image processor resizes the image, cuts a ``rows x cols`` grid of square crops and appends the
whole image scaled to one crop (no grid when splitting is off or the image fits one crop:
``rows = cols = 0``, the global view alone). Every view goes through the SigLIP-style tower, the
connector's pixel shuffle and projection, and yields ``image_seq_len`` rows. The processor writes
``<fake_token_around_image><row_i_col_j>`` and ``<global-img>`` around each view's ``<image>`` run:
text, not rows. An image yields ``(rows * cols + 1) * image_seq_len`` rows (``image_seq_len`` alone
without a grid); ``crop_grid`` ``[rows, cols]`` is the metadata a precomputed item must carry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from PIL import Image
from transformers import Idefics3Config, Idefics3ImageProcessorPil, SmolVLMImageProcessorPil
from transformers.models.idefics3.modeling_idefics3 import Idefics3Connector, Idefics3VisionTransformer
from transformers.models.smolvlm.modeling_smolvlm import SmolVLMConnector, SmolVLMVisionTransformer

from mmencode.models.base import EncoderAdapter, EncoderOutput, PreparedItem

_GRID = "crop_grid"


def _views(rows: int, cols: int) -> int:
    return rows * cols + 1 if rows or cols else 1


class Idefics3Encoder(torch.nn.Module):
    """The vision half of ``Idefics3Model``: tower and connector; no language model."""

    tower: ClassVar[Any] = Idefics3VisionTransformer
    connector_class: ClassVar[Any] = Idefics3Connector

    def __init__(self, config: Idefics3Config) -> None:
        super().__init__()
        vision: Any = config.vision_config
        self.patch_size = int(vision.patch_size)
        # Same attribute names as Idefics3Model, so checkpoint keys map one to one under "model.".
        self.vision_model = self.tower._from_config(vision)
        self.connector = self.connector_class(config)

    def forward(self, pixel_values: torch.Tensor, pixel_attention_mask: torch.Tensor) -> torch.Tensor:
        # As Idefics3Model.get_image_features: a patch attends where any of its pixels is not padding.
        patches = pixel_attention_mask.unfold(1, self.patch_size, self.patch_size)
        patches = patches.unfold(2, self.patch_size, self.patch_size)
        patch_attention_mask = patches.sum(dim=(-1, -2)) > 0
        hidden = self.vision_model(pixel_values=pixel_values, patch_attention_mask=patch_attention_mask)
        projected: torch.Tensor = self.connector(hidden.last_hidden_state)
        return projected


class SmolVLMEncoder(Idefics3Encoder):
    tower = SmolVLMVisionTransformer
    connector_class = SmolVLMConnector


class Idefics3Adapter(EncoderAdapter):
    family = "idefics3"
    required_metadata = (_GRID,)
    tower_class: ClassVar[type[torch.nn.Module]] = Idefics3Encoder
    processor_class: ClassVar[type] = Idefics3ImageProcessorPil
    weight_prefixes: ClassVar[tuple[str, ...]] = ("model.", "")

    @property
    def hidden_size(self) -> int:
        return int(self.config.text_config.hidden_size)

    @property
    def rows_per_view(self) -> int:
        # The processor's image_seq_len (what it writes per view); the model's own formula as the fallback.
        vision = self.config.vision_config
        own = (vision.image_size // vision.patch_size) ** 2 // self.config.scale_factor**2
        return int(self.processor_config.setting("image_seq_len", own))

    def preprocess(self, image: Image.Image) -> PreparedItem:
        out = self.processor(images=[[image]], return_tensors="pt", return_row_col_info=True)
        rows, cols = int(out["rows"][0][0]), int(out["cols"][0][0])
        # One image per call: no padding views, every view is real.
        pixel_values = out["pixel_values"][0]
        return PreparedItem(
            tensors={"pixel_values": pixel_values, "pixel_attention_mask": out["pixel_attention_mask"][0]},
            metadata={_GRID: [rows, cols]},
            num_tokens=_views(rows, cols) * self.rows_per_view,
        )

    def tokens_from_metadata(self, metadata: Mapping[str, Any]) -> int:
        grid = self._int_list(metadata, _GRID, ("rows", "cols"), minimum=0)
        return _views(*grid) * self.rows_per_view

    def _forward(self, batch: dict[str, torch.Tensor], items: Sequence[PreparedItem]) -> EncoderOutput:
        views = self.module(batch["pixel_values"], batch["pixel_attention_mask"])
        count, rows, width = views.shape
        per_item = [_views(*item.metadata[_GRID]) * rows for item in items]
        return EncoderOutput(rows=views.reshape(count * rows, width), rows_per_item=per_item)


class SmolVLMAdapter(Idefics3Adapter):
    family = "smolvlm"
    tower_class = SmolVLMEncoder
    processor_class = SmolVLMImageProcessorPil
