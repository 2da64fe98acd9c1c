"""Mistral 3 (Pixtral vision tower, patch merger, projector): dynamic resolution, metadata ``image_sizes``.

The image processor resizes each image (aspect ratio kept, longest edge bounded) to multiples of
``patch_size * spatial_merge_size``, as PixtralProcessor asks it to; the tower embeds each image at its
own size and attends within it, the projector's patch merger folds ``spatial_merge_size**2`` neighbours
into one row. PixtralProcessor writes one ``[IMG]`` per merged patch, an ``[IMG_BREAK]`` after each row
of them and ``[IMG_END]`` last: the breaks and the end are text, not rows. An image of processed size
``(h, w)`` yields ``(h // (patch * merge)) * (w // (patch * merge))`` rows; ``image_sizes`` ``[h, w]``
(the processed size, as the processor reports it and vLLM passes it) is the metadata a precomputed item
must carry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from PIL import Image
from transformers import AutoModel, Mistral3Config, PixtralImageProcessorPil
from transformers.models.mistral3.modeling_mistral3 import Mistral3MultiModalProjector

from mmencode.models.base import EncoderAdapter, EncoderOutput, PreparedItem

_SIZES = "image_sizes"


class Mistral3Encoder(torch.nn.Module):
    """The vision half of ``Mistral3Model``: Pixtral tower and projector; no language model."""

    def __init__(self, config: Mistral3Config) -> None:
        super().__init__()
        self.feature_layer = config.vision_feature_layer
        # Same attribute names as Mistral3Model, so checkpoint keys map one to one under "model.".
        self.vision_tower = AutoModel.from_config(config.vision_config)
        self.multi_modal_projector = Mistral3MultiModalProjector(config)

    def forward(self, pixel_values: torch.Tensor, image_sizes: torch.Tensor) -> torch.Tensor:
        out = self.vision_tower(pixel_values, image_sizes=image_sizes, output_hidden_states=True)
        # As Mistral3Model.get_image_features: one feature layer, or several side by side.
        layers = [self.feature_layer] if isinstance(self.feature_layer, int) else list(self.feature_layer)
        features = torch.cat([out.hidden_states[layer] for layer in layers], dim=-1)
        projected: torch.Tensor = self.multi_modal_projector(features.squeeze(0), image_sizes)
        return projected


class Mistral3Adapter(EncoderAdapter):
    family = "mistral3"
    required_metadata = (_SIZES,)
    tower_class: ClassVar[type[torch.nn.Module]] = Mistral3Encoder
    processor_class: ClassVar[type] = PixtralImageProcessorPil
    weight_prefixes: ClassVar[tuple[str, ...]] = ("model.", "")

    @property
    def hidden_size(self) -> int:
        return int(self.config.text_config.hidden_size)

    @property
    def tokens_side(self) -> int:
        """Pixels per row along each side: the processor's patch size times its spatial merge size."""
        patch: Any = self.processor_config.setting("patch_size", self.config.vision_config.patch_size)
        if isinstance(patch, Mapping):
            patch = patch["height"]
        merge = self.processor_config.setting("spatial_merge_size", self.config.spatial_merge_size)
        return int(patch) * int(merge)

    def _rows(self, height: int, width: int) -> int:
        return (height // self.tokens_side) * (width // self.tokens_side)

    def preprocess(self, image: Image.Image) -> PreparedItem:
        # As PixtralProcessor calls its image processor: resized to multiples of patch * merge, not of
        # the patch alone (a 37x101 image is 112x48, 21 rows; rounding to the patch gave 104x40, 12 rows).
        out = self.processor(images=[image], return_tensors="pt", patch_size=self.tokens_side)
        height, width = (int(v) for v in out["image_sizes"][0])
        return PreparedItem(
            tensors={"pixel_values": out["pixel_values"], "image_sizes": torch.tensor([[height, width]])},
            metadata={_SIZES: [height, width]},
            num_tokens=self._rows(height, width),
        )

    def tokens_from_metadata(self, metadata: Mapping[str, Any]) -> int:
        return self._rows(*self._int_list(metadata, _SIZES, ("height", "width")))

    def collate(self, items: Sequence[PreparedItem]) -> dict[str, torch.Tensor]:
        # Images keep their own sizes: pad to the largest, as the processor pads a batch; the tower
        # crops each back to its image_sizes, so the padding never reaches a row.
        height = max(int(item.tensors["pixel_values"].shape[-2]) for item in items)
        width = max(int(item.tensors["pixel_values"].shape[-1]) for item in items)
        padded = [
            torch.nn.functional.pad(
                item.tensors["pixel_values"],
                (0, width - item.tensors["pixel_values"].shape[-1], 0, height - item.tensors["pixel_values"].shape[-2]),
            )
            for item in items
        ]
        return {"pixel_values": torch.cat(padded), "image_sizes": torch.cat([i.tensors["image_sizes"] for i in items])}

    def _forward(self, batch: dict[str, torch.Tensor], items: Sequence[PreparedItem]) -> EncoderOutput:
        rows = self.module(batch["pixel_values"], batch["image_sizes"])
        # The merger's output is one packed sequence; per image it is what the sizes imply.
        return EncoderOutput(rows=rows, rows_per_item=None)
