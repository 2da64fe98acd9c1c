"""Fixed resolution: SigLIP and CLIP vision towers.

Every image is resized to the tower's input size and yields the same rows: one per patch, plus the
class token for CLIP. Rows are the tower's ``last_hidden_state``; images are stacked into one batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from PIL import Image
from transformers import CLIPImageProcessorPil, CLIPVisionModel, SiglipImageProcessorPil, SiglipVisionModel

from mmencode.models.base import EncoderAdapter, EncoderOutput, PreparedItem
from mmencode.models.fixed_preprocess import FixedResolutionPreprocessor, TorchvisionFixedResolutionPreprocessor


class SiglipAdapter(EncoderAdapter):
    family = "siglip"
    required_metadata = ()
    tower_class: ClassVar[type[torch.nn.Module]] = SiglipVisionModel
    processor_class: ClassVar[type] = SiglipImageProcessorPil
    # A dual-encoder save keeps the tower under ``vision_model.``; a standalone vision save at the root.
    weight_prefixes: ClassVar[tuple[str, ...]] = ("vision_model.", "")
    class_tokens: ClassVar[int] = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Fewer passes over the pixels, used only once it matched this checkpoint's processor bit for
        # bit on probe images (see models.fixed_preprocess); otherwise transformers' processor.
        fast: type[FixedResolutionPreprocessor | TorchvisionFixedResolutionPreprocessor] = (
            TorchvisionFixedResolutionPreprocessor
            if self.image_processor_backend == "torchvision"
            else FixedResolutionPreprocessor
        )
        self.fast_preprocessor = fast.verified(self.processor, label=f"{self.family} encoder")

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    def _rows_for(self, height: int, width: int) -> int:
        patch = int(self.config.patch_size)
        return (height // patch) * (width // patch) + self.class_tokens

    def preprocess(self, image: Image.Image) -> PreparedItem:
        pixel_values = self.fast_preprocessor(image) if self.fast_preprocessor is not None else None
        if pixel_values is None:
            pixel_values = self.processor(images=[image], return_tensors="pt")["pixel_values"]
        return PreparedItem(
            tensors={"pixel_values": pixel_values},
            metadata={},
            num_tokens=self._rows_for(pixel_values.shape[-2], pixel_values.shape[-1]),
        )

    def tokens_from_metadata(self, metadata: Mapping[str, Any]) -> int:
        size = int(self.config.image_size)
        return self._rows_for(size, size)

    def _forward(self, batch: dict[str, torch.Tensor], items: Sequence[PreparedItem]) -> EncoderOutput:
        hidden = self.module(pixel_values=batch["pixel_values"]).last_hidden_state
        count, rows, width = hidden.shape
        return EncoderOutput(rows=hidden.reshape(count * rows, width), rows_per_item=[rows] * count)


class ClipAdapter(SiglipAdapter):
    family = "clip"
    tower_class = CLIPVisionModel
    processor_class = CLIPImageProcessorPil
    class_tokens = 1
