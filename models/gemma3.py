"""Gemma 3: a SigLIP tower and the multimodal projector's average pooling; a fixed number of rows per view.

Each view (the whole image, plus its pan-and-scan crops when enabled) goes through the SigLIP tower,
is average-pooled to ``mm_tokens_per_image`` positions, RMS-normed and projected to the language width.
Gemma3Processor writes ``image_seq_length`` soft tokens per view, each run wrapped in
``<start_of_image>``/``<end_of_image>`` with text between the crops ("here are some crops..."): those
are text, not rows. An image yields ``(1 + num_crops) * image_seq_length`` rows.

Pan-and-scan follows the checkpoint's image processor settings (``do_pan_and_scan`` and its limits), as
the image processor applies them; ``Gemma3Processor`` itself turns it off unless the call asks for it
(vLLM's ``mm_processor_kwargs``), so a checkpoint that enables it here is served with crops. When it is
on, ``num_crops`` is the metadata a precomputed item must carry; when off, every image has 0 crops.
"""

from __future__ import annotations

import reprlib
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from PIL import Image
from transformers import AutoModel, Gemma3Config, Gemma3ImageProcessorPil
from transformers.models.gemma3.modeling_gemma3 import Gemma3MultiModalProjector

from mmencode.models.base import EncoderAdapter, EncoderOutput, PreparedItem
from mmencode.models.errors import MetadataError
from mmencode.models.weights import transformers4_layout

_CROPS = "num_crops"


class Gemma3Encoder(torch.nn.Module):
    """The vision half of ``Gemma3Model``: SigLIP tower and projector; no language model."""

    def __init__(self, config: Gemma3Config) -> None:
        super().__init__()
        # Same attribute names as Gemma3Model, so checkpoint keys map one to one under "model.".
        self.vision_tower = AutoModel.from_config(config.vision_config)
        self.multi_modal_projector = Gemma3MultiModalProjector(config)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        hidden = self.vision_tower(pixel_values=pixel_values).last_hidden_state
        projected: torch.Tensor = self.multi_modal_projector(hidden)
        return projected


class Gemma3Adapter(EncoderAdapter):
    family = "gemma3"
    required_metadata = (_CROPS,)
    tower_class: ClassVar[type[torch.nn.Module]] = Gemma3Encoder
    processor_class: ClassVar[type] = Gemma3ImageProcessorPil
    # transformers 5 saves the towers under "model."; the Gemma 3 hub repos (saved by transformers 4)
    # keep them at the root, with the SigLIP tower's own vision_model level.
    weight_prefixes: ClassVar[tuple[str, ...]] = ("model.", "")
    key_maps = (transformers4_layout("multi_modal_projector."),)

    @property
    def hidden_size(self) -> int:
        return int(self.config.text_config.hidden_size)

    @property
    def rows_per_view(self) -> int:
        # The processor's count (the language side's placeholders); the model's is mm_tokens_per_image.
        return int(self.processor_config.setting("image_seq_length", self.config.mm_tokens_per_image))

    @property
    def pan_and_scan(self) -> bool:
        return bool(getattr(self.processor, "do_pan_and_scan", False))

    def preprocess(self, image: Image.Image) -> PreparedItem:
        out = self.processor(images=[image], return_tensors="pt")
        crops = int(out[_CROPS][0])
        return PreparedItem(
            tensors={"pixel_values": out["pixel_values"]},
            metadata={_CROPS: crops},
            num_tokens=(1 + crops) * self.rows_per_view,
        )

    def tokens_from_metadata(self, metadata: Mapping[str, Any]) -> int:
        crops = metadata.get(_CROPS)
        if crops is None:
            if self.pan_and_scan:
                raise MetadataError(_CROPS, "is required: this checkpoint enables pan-and-scan crops", missing=True)
            crops = 0
        if isinstance(crops, bool) or not isinstance(crops, int) or crops < 0:
            raise MetadataError(_CROPS, f"must be a non-negative integer, got {reprlib.repr(crops)}", missing=False)
        if crops and not self.pan_and_scan:
            raise MetadataError(_CROPS, f"must be 0: this checkpoint makes no crops, got {crops}", missing=False)
        return (1 + crops) * self.rows_per_view

    def _forward(self, batch: dict[str, torch.Tensor], items: Sequence[PreparedItem]) -> EncoderOutput:
        views = self.module(batch["pixel_values"])
        count, rows, width = views.shape
        per_item = [(1 + item.metadata[_CROPS]) * rows for item in items]
        return EncoderOutput(rows=views.reshape(count * rows, width), rows_per_item=per_item)
