"""Which adapter serves a checkpoint, and the one loading path every checkpoint goes through."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3
import torch
from transformers import AutoConfig

from models.base import EncoderAdapter
from models.errors import CheckpointError
from models.fixed import ClipAdapter, SiglipAdapter
from models.internvl import InternVLAdapter
from models.qwen2_vl import Qwen2_5_VLAdapter, Qwen2VLAdapter
from models.weights import load_config_json, load_encoder_weights

__all__ = ["load_encoder", "supported_families"]

logger = logging.getLogger(__name__)


def _vision(config: Any) -> Any:
    return config.vision_config


def _itself(config: Any) -> Any:
    return config


@dataclass(frozen=True)
class _Family:
    adapter: type[EncoderAdapter]
    # Picks the config the tower is built from out of the checkpoint's config.
    tower_config: Callable[[Any], Any]


# config.json's model_type -> family. A full VLM or dual encoder, and a standalone tower.
_FAMILIES: dict[str, _Family] = {
    "qwen2_vl": _Family(Qwen2VLAdapter, _vision),
    "qwen2_vl_vision": _Family(Qwen2VLAdapter, _itself),
    "qwen2_5_vl": _Family(Qwen2_5_VLAdapter, _vision),
    "qwen2_5_vl_vision": _Family(Qwen2_5_VLAdapter, _itself),
    "siglip": _Family(SiglipAdapter, _vision),
    "siglip_vision_model": _Family(SiglipAdapter, _itself),
    "clip": _Family(ClipAdapter, _vision),
    "clip_vision_model": _Family(ClipAdapter, _itself),
    # The projector needs the language width, so InternVL is built from the full config.
    "internvl": _Family(InternVLAdapter, _itself),
}


def supported_families() -> list[str]:
    return sorted({family.adapter.family for family in _FAMILIES.values()})


def load_encoder(checkpoint: Path | str, *, device: torch.device, dtype: torch.dtype) -> EncoderAdapter:
    """Build the encoder of a local ``save_pretrained`` directory on ``device``; never the language model."""
    checkpoint = Path(checkpoint)
    model_type = str(load_config_json(checkpoint).get("model_type"))
    family = _FAMILIES.get(model_type)
    if family is None:
        raise CheckpointError(
            f"model_type {model_type!r} in {checkpoint}/config.json is not supported; supported: {sorted(_FAMILIES)}"
        )
    adapter_cls = family.adapter
    config = AutoConfig.from_pretrained(checkpoint, local_files_only=True)
    tower_config = family.tower_config(config)
    if not (checkpoint / "preprocessor_config.json").is_file():
        raise CheckpointError(f"{checkpoint} has no preprocessor_config.json: the image processor is required")
    processor: Any = adapter_cls.processor_class.from_pretrained(checkpoint, local_files_only=True)  # type: ignore[attr-defined]

    module: torch.nn.Module = adapter_cls.tower_class(tower_config)
    hasher = blake3.blake3()
    hasher.update(adapter_cls.family.encode())
    # The files as shipped, not re-serialised configs: the same on every replica and library version.
    for name in ("config.json", "preprocessor_config.json"):
        hasher.update((checkpoint / name).read_bytes())
    prefix = load_encoder_weights(module, checkpoint, adapter_cls.weight_prefixes, hasher)
    # The compute dtype and the kind of device change the rows too (bf16 vs fp32; GPU vs CPU kernels):
    # a content hash is handed to vLLM as the item's `uuid`, so it must never name two sets of rows.
    hasher.update(f"compute:{dtype};device:{device.type}".encode())
    module.requires_grad_(False)
    module.to(device=device, dtype=dtype).eval()
    logger.info(
        "loaded %s encoder from %s (weights under %r) on %s as %s",
        adapter_cls.family,
        checkpoint,
        prefix or "<root>",
        device,
        dtype,
    )
    return adapter_cls(
        module,
        processor,
        tower_config,
        checkpoint=checkpoint,
        device=device,
        dtype=dtype,
        fingerprint=hasher.hexdigest(),
    )
