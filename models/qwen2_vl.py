"""Dynamic resolution: the Qwen2-VL and Qwen2.5-VL vision towers.

Each image becomes ``t*h*w`` patches; the tower's merger folds ``merge_size**2`` neighbours into one
row of the language model's width, so an image yields ``t*h*w / merge_size**2`` rows. Images of any
sizes are packed into one forward: concatenated patches plus one ``grid_thw`` row per image.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from PIL import Image
from transformers import Qwen2VLImageProcessorPil
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

from mmencode.models.base import EncoderAdapter, EncoderOutput, PreparedImage
from mmencode.models.dynamic_preprocess import DynamicResolutionPreprocessor
from mmencode.models.errors import MetadataError


class Qwen2VLAdapter(EncoderAdapter):
    family = "qwen2_vl"
    required_metadata = ("image_grid_thw",)
    tower_class: ClassVar[type[torch.nn.Module]] = Qwen2VisionTransformerPretrainedModel
    processor_class: ClassVar[type] = Qwen2VLImageProcessorPil
    # Where the tower sits: transformers 5 full save, original hub layout, standalone tower.
    weight_prefixes: ClassVar[tuple[str, ...]] = ("model.visual.", "visual.", "")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Fewer passes over the pixels, used only once it matched this checkpoint's processor bit for
        # bit on probe images (see models.dynamic_preprocess); otherwise transformers' processor, as
        # for the subclasses whose processors are other classes (GLM-4.1V, Kimi).
        self.fast_preprocessor = DynamicResolutionPreprocessor.verified(self.processor, label=f"{self.family} encoder")

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def merge_size(self) -> int:
        # The processor's value, as the language side uses it to count placeholders.
        return int(self.processor.merge_size)

    def preprocess(self, image: Image.Image) -> PreparedImage:
        out = self.fast_preprocessor(image) if self.fast_preprocessor is not None else None
        if out is None:
            out = self.processor(images=[image], return_tensors="pt")
        grid = out["image_grid_thw"]
        t, h, w = (int(v) for v in grid[0])
        return PreparedImage(
            tensors={"pixel_values": out["pixel_values"], "image_grid_thw": grid},
            metadata={"image_grid_thw": [t, h, w]},
            num_tokens=t * h * w // self.merge_size**2,
        )

    def tokens_from_metadata(self, metadata: Mapping[str, Any]) -> int:
        field = "image_grid_thw"
        grid = self._int_list(metadata, field, ("t", "h", "w"))
        if (grid[1] % self.merge_size) or (grid[2] % self.merge_size):
            raise MetadataError(
                field,
                f"h and w must be multiples of merge_size {self.merge_size}, got {reprlib.repr(grid)}",
                missing=False,
            )
        return math.prod(grid) // self.merge_size**2

    def _forward(self, batch: dict[str, torch.Tensor], items: Sequence[PreparedImage]) -> EncoderOutput:
        out = self.module(hidden_states=batch["pixel_values"], grid_thw=batch["image_grid_thw"])
        # One packed sequence for the whole batch: only the total row count is observable.
        return EncoderOutput(rows=out.pooler_output, rows_per_item=None)


class Qwen2_5_VLAdapter(Qwen2VLAdapter):
    family = "qwen2_5_vl"
    tower_class = Qwen2_5_VisionTransformerPretrainedModel

    @property
    def hidden_size(self) -> int:
        return int(self.config.out_hidden_size)
