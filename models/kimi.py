"""Kimi (``kimi_k25``, Kimi-K2.5/K2.6): a 2D patch grid, pooled 2x2, counted as Qwen2-VL counts.

``Kimi_K25ImageProcessor`` scales an image down to its patch budget (``max_patches``, and
``size.max_height`` patches per side), then *pads* it up to a multiple of ``patch_size * merge_size``
and reports the padded patch grid ``image_grid_thw = [1, h, w]``. The tower pools every
``merge_kernel_size`` block of the grid into one row after the projector, so an image yields
``h * w / merge_size**2`` rows: the ``<|media_pad|>`` count of ``Kimi_K25Processor.replace_image_token``.
That count depends on the padded grid, not on the image's own size, and on the processor's
``merge_size`` agreeing with the tower's ``merge_kernel_size``: the token-drift source this family is
known for, checked here on every batch. Images of any sizes are packed into one forward.

The image processor exists only on transformers' torchvision backend: without torchvision the
checkpoint is refused at load with a sentence saying so.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from transformers import Kimi_K25Config
from transformers.models.kimi_k25.modeling_kimi_k25 import Kimi_K25MultimodalProjection, Kimi_K25VisionModel

from mmencode.models.base import EncoderOutput, PreparedItem
from mmencode.models.optional import require_torchvision, require_torchvision_backend
from mmencode.models.processor_backend import Backend
from mmencode.models.processor_config import ProcessorConfig
from mmencode.models.qwen2_vl import Qwen2VLAdapter
from mmencode.models.weights import FusedQKV, KeyMap, renamed, rotary_reordered

# ----- the layout Kimi repos ship (and transformers' save_pretrained writes back) -----
_KIMI_RENAMES = (
    ("vision_tower.patch_embed.pos_emb.position_embeddings", "vision_tower.patch_embed.pos_emb.weight"),
    ("vision_tower.patch_embed.proj.", "vision_tower.encoder.patch_embed.proj."),
    ("vision_tower.final_layernorm.", "vision_tower.encoder.final_layernorm."),
    (".norm1.", ".norm0."),
    (".norm2.", ".norm1."),
    (".mlp.fc1.", ".mlp.fc0."),
    (".mlp.fc2.", ".mlp.fc1."),
    (".attn.proj.", ".wo."),
    ("mm_projector.in_proj.", "mm_projector.proj.0."),
    ("mm_projector.out_proj.", "mm_projector.proj.2."),
)
_KIMI_QKV = FusedQKV(re.compile(r"\.attn\.([qkv])_proj\.(weight|bias)$"), ".wqkv.{kind}")


def kimi_hub_key(name: str, *, pre_norm: str = "mm_projector.pre_norm.") -> tuple[str, int | None]:
    """Where a tensor of :class:`KimiEncoder` sits in a Kimi repo (the inverse of transformers'
    ``kimi_k25`` conversion renames), and which third of the fused ``wqkv`` it is."""
    if name.startswith("mm_projector.pre_norm."):
        return pre_norm + name.removeprefix("mm_projector.pre_norm."), None
    key = re.sub(r"^vision_tower\.layers\.(\d+)\.", r"vision_tower.encoder.blocks.\1.", name)
    return _KIMI_QKV.locate(renamed(key, _KIMI_RENAMES))


_kimi_rotary = rotary_reordered(r"\.attn\.[qk]_proj\.", tower="vision_tower")


# The repos keep the projector's norm at top level; transformers' save_pretrained writes it under
# ``model.`` (its conversion has no rename for it) and loads either.
_KIMI_LAYOUTS = (
    KeyMap(
        roots=("vision_tower.", "mm_projector."),
        source=kimi_hub_key,
        name="Kimi repo layout",
        transform=_kimi_rotary,
    ),
    KeyMap(
        roots=("vision_tower.", "mm_projector.", "model.mm_projector."),
        source=lambda name: kimi_hub_key(name, pre_norm="model.mm_projector.pre_norm."),
        name="Kimi layout as transformers saves it",
        transform=_kimi_rotary,
    ),
)


class KimiEncoder(torch.nn.Module):
    """The vision half of ``Kimi_K25Model``: tower and projector, under the same attribute names."""

    def __init__(self, config: Kimi_K25Config) -> None:
        super().__init__()
        vision: Any = config.vision_config
        self.vision_tower = Kimi_K25VisionModel(vision)
        self.mm_projector = Kimi_K25MultimodalProjection(config)

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        pooled = self.vision_tower(pixel_values, grid_thw=grid_thw).pooler_output  # (rows, kernel, hidden)
        rows: torch.Tensor = self.mm_projector(pooled).squeeze(1)
        return rows


class KimiAdapter(Qwen2VLAdapter):
    family = "kimi_k25"
    video_processor_class = None  # their video processors differ from Qwen2-VL's: not served yet
    tower_class: ClassVar[type[torch.nn.Module]] = KimiEncoder
    weight_prefixes: ClassVar[tuple[str, ...]] = ("model.", "")
    key_maps = _KIMI_LAYOUTS

    @classmethod
    def load_config(cls, checkpoint: Path) -> Any:
        require_torchvision(cls.family)  # before any weight is read
        return super().load_config(checkpoint)

    @classmethod
    def build_processor(cls, config: ProcessorConfig, backend: Backend) -> Any:
        require_torchvision(cls.family)
        require_torchvision_backend(cls.family, backend)
        from transformers import Kimi_K25ImageProcessor

        return Kimi_K25ImageProcessor.from_dict(config.image_processor)

    @property
    def hidden_size(self) -> int:
        return int(self.config.text_config.hidden_size)

    def _forward(self, batch: dict[str, torch.Tensor], items: Sequence[PreparedItem]) -> EncoderOutput:
        rows = self.module(batch["pixel_values"], batch["image_grid_thw"])
        # One packed sequence for the whole batch: only the total row count is observable.
        return EncoderOutput(rows=rows, rows_per_item=None)
