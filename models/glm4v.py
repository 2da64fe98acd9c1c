"""GLM-4.1V: dynamic resolution with ``image_grid_thw``, counted as Qwen2-VL counts.

Glm4vProcessor writes ``t*h*w / merge_size**2`` ``<|image|>`` tokens per image (its
``replace_image_token``); the tower (patch embed, learned position embeddings resampled per image,
a 2x2 conv downsample and the merger) yields as many rows, packed for any number of image sizes.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from transformers import Glm4vImageProcessorPil
from transformers.models.glm4v.modeling_glm4v import Glm4vVisionModel

from mmencode.models.qwen2_vl import Qwen2VLAdapter


class Glm4vAdapter(Qwen2VLAdapter):
    family = "glm4v"
    video_processor_class = None  # their video processors differ from Qwen2-VL's: not served yet
    tower_class: ClassVar[type[torch.nn.Module]] = Glm4vVisionModel
    processor_class: ClassVar[type] = Glm4vImageProcessorPil

    @property
    def hidden_size(self) -> int:
        return int(self.config.out_hidden_size)
