"""Step3 (``step3p7``, Step-3.7-Flash): crops plus a global view, each through the same tower.

``Step3p7ImageProcessor`` squares the whole image into one global view of ``size`` and, for images
larger or more elongated than that view, cuts ``num_patches`` local crops of ``patch_size`` with a
sliding window that adapts to the aspect ratio. Every view goes through the ViT and two stride-2
convolutions (``(side // (vision_patch_size * downsampler_stride))**2`` positions) and the projector.
The language model scatters the crops' rows first, in order, then the global view's
(``Step3p7Model.get_image_features``), so an image yields
``num_patches * rows_per_crop + rows_per_global`` rows: the ``<im_patch>`` count that
``Step3p7Processor.replace_image_token`` writes. ``<patch_start>``, ``<patch_end>``,
``<patch_newline>``, ``<im_start>`` and ``<im_end>`` around them are text, not rows.

``num_patches`` (how many local crops; 0 for an image that fits the global view) cannot be derived
from an embedding: a precomputed item must carry it (the ``missing_metadata`` failure of SPEC.md).
The image processor exists only on transformers' torchvision backend: without torchvision the
checkpoint is refused at load with a sentence saying so.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from PIL import Image
from transformers import Step3p7Config
from transformers.models.step3p7.modeling_step3p7 import Step3p7VisionModel

from mmencode.models.base import EncoderAdapter, EncoderOutput, PreparedItem
from mmencode.models.optional import require_torchvision, require_torchvision_backend
from mmencode.models.processor_backend import Backend
from mmencode.models.processor_config import ProcessorConfig
from mmencode.models.weights import FusedQKV, KeyMap, renamed, rotary_reordered

# ----- the layout Step3 repos ship (and transformers' save_pretrained writes back) -----
_STEP3_RENAMES = (
    (".embeddings.patch_embedding.", ".conv1."),
    (".embeddings.position_embedding.weight", ".positional_embedding"),
    (".pre_layernorm.", ".ln_pre."),
    (".downsampler1.", ".vit_downsampler1."),
    (".downsampler2.", ".vit_downsampler2."),
    (".lambda_1", ".ls_1.gamma"),
    (".lambda_2", ".ls_2.gamma"),
    (".mlp.fc1.", ".mlp.c_fc."),
    (".mlp.fc2.", ".mlp.c_proj."),
    (".self_attn.out_proj.", ".attn.out_proj."),
    (".layernorm_before.", ".ln_1."),
    (".layernorm_after.", ".ln_2."),
)
_STEP3_QKV = FusedQKV(re.compile(r"\.self_attn\.([qkv])_proj\.(weight|bias)$"), ".attn.in_proj_{kind}")


def step3_hub_key(name: str) -> tuple[str, int | None]:
    """Where a tensor of :class:`Step3Encoder` sits in a Step3 repo (the inverse of transformers'
    ``step3p7`` / ``step3p5_vision`` conversion renames), and which third of the fused ``in_proj`` it is."""
    if name.startswith("multi_modal_projector."):
        return "vit_large_projector." + name.removeprefix("multi_modal_projector."), None
    key = re.sub(r"^vision_model\.layers\.(\d+)\.", r"vision_model.transformer.resblocks.\1.", name)
    return _STEP3_QKV.locate(renamed(key, _STEP3_RENAMES))


_step3_rotary = rotary_reordered(r"\.self_attn\.[qk]_proj\.", tower="vision_model")


_STEP3_LAYOUT = KeyMap(
    roots=("vision_model.", "vit_large_projector."),
    source=step3_hub_key,
    name="Step3 repo layout",
    transform=_step3_rotary,
)


class Step3Encoder(torch.nn.Module):
    """The vision half of ``Step3p7Model``: tower and projector, under the same attribute names."""

    def __init__(self, config: Step3p7Config) -> None:
        super().__init__()
        vision: Any = config.vision_config
        text: Any = config.text_config
        self.vision_model = Step3p7VisionModel(vision)
        # Two stride-2 downsampling convolutions each double the channels: hidden_size * 4.
        self.multi_modal_projector = torch.nn.Linear(
            vision.hidden_size * 4, text.hidden_size, bias=config.projector_bias
        )

    def forward(self, views: torch.Tensor) -> torch.Tensor:
        """(views, 3, side, side) -> (views, positions, language width)."""
        projected: torch.Tensor = self.multi_modal_projector(self.vision_model(views).last_hidden_state)
        return projected


class Step3Adapter(EncoderAdapter):
    family = "step3p7"
    required_metadata = ("num_patches",)
    tower_class: ClassVar[type[torch.nn.Module]] = Step3Encoder
    weight_prefixes: ClassVar[tuple[str, ...]] = ("model.", "")
    key_maps = (_STEP3_LAYOUT,)

    @classmethod
    def load_config(cls, checkpoint: Path) -> Any:
        require_torchvision(cls.family)  # before any weight is read
        return super().load_config(checkpoint)

    @classmethod
    def build_processor(cls, config: ProcessorConfig, backend: Backend) -> Any:
        require_torchvision(cls.family)
        require_torchvision_backend(cls.family, backend)
        from transformers.models.step3p7.image_processing_step3p7 import Step3p7ImageProcessor

        return Step3p7ImageProcessor.from_dict(config.image_processor)

    @property
    def hidden_size(self) -> int:
        return int(self.config.text_config.hidden_size)

    def _rows_per_view(self, side: int) -> int:
        # As Step3p7Processor.__init__: from the image processor's own settings, the language side's count.
        stride = int(self.processor.vision_patch_size) * int(self.processor.downsampler_stride)
        return (side // stride) ** 2

    @property
    def rows_per_crop(self) -> int:
        return self._rows_per_view(int(self.processor.patch_size))

    @property
    def rows_per_global(self) -> int:
        return self._rows_per_view(int(self.processor.size["height"]))

    def preprocess(self, image: Image.Image) -> PreparedItem:
        out = self.processor(images=[image], return_tensors="pt")
        num_patches = int(out["num_local_patches"][0])
        crop = int(self.processor.patch_size)
        local = out["pixel_values_local"] if num_patches else torch.empty(0, 3, crop, crop)
        return PreparedItem(
            tensors={"pixel_values": out["pixel_values"], "pixel_values_local": local},
            metadata={"num_patches": num_patches},
            num_tokens=num_patches * self.rows_per_crop + self.rows_per_global,
        )

    def tokens_from_metadata(self, metadata: Mapping[str, Any]) -> int:
        # 0 is valid: an image that fits the global view has no local crops.
        crops = self._int_field(metadata, "num_patches", minimum=0)
        return crops * self.rows_per_crop + self.rows_per_global

    def _forward(self, batch: dict[str, torch.Tensor], items: Sequence[PreparedItem]) -> EncoderOutput:
        global_rows = self.module(batch["pixel_values"])
        local = batch["pixel_values_local"]
        crop_rows = self.module(local.to(self.dtype)) if local.shape[0] else None
        merged: list[torch.Tensor] = []
        start = 0
        for index, item in enumerate(items):
            count = int(item.metadata["num_patches"])
            if count and crop_rows is not None:
                merged.append(crop_rows[start : start + count].reshape(-1, crop_rows.shape[-1]))
            merged.append(global_rows[index])
            start += count
        return EncoderOutput(
            rows=torch.cat(merged),
            rows_per_item=[
                int(item.metadata["num_patches"]) * (crop_rows.shape[1] if crop_rows is not None else 0)
                + int(global_rows.shape[1])
                for item in items
            ],
        )

    def warmup_image(self) -> Image.Image:
        # Just wider than the global view, and 2:1: the warm-up runs the crop path too, on two crops.
        side = int(self.processor.size["width"])
        return Image.new("RGB", (side + 8, side // 2), (127, 64, 200))
