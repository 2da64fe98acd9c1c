"""Which adapter serves a checkpoint, and the one loading path every checkpoint goes through."""

from __future__ import annotations

import importlib
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3
import torch

from mmencode.models.base import EncoderAdapter
from mmencode.models.catalog import CATALOG, FamilyInfo
from mmencode.models.errors import CheckpointError
from mmencode.models.optional import require_torchvision
from mmencode.models.processor_backend import BackendChoice, resolve_backend
from mmencode.models.video_processor import load_video_processor
from mmencode.models.weights import load_config_json, load_encoder_weights, weight_files

__all__ = ["check_checkpoint", "load_encoder", "supported_families", "supported_model_types"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Family:
    info: FamilyInfo
    adapter: type[EncoderAdapter]

    def tower_config(self, config: Any) -> Any:
        """The config the tower is built from, out of the checkpoint's config."""
        return config.vision_config if self.info.tower_config == "vision_config" else config


def _adapter(path: str) -> type[EncoderAdapter]:
    module, name = path.split(":")
    adapter: type[EncoderAdapter] = getattr(importlib.import_module(f"mmencode.models.{module}"), name)
    return adapter


# config.json's model_type -> family, as models/catalog.py lists them (a full VLM or dual encoder, and a
# standalone tower).
_FAMILIES: dict[str, _Family] = {info.model_type: _Family(info, _adapter(info.adapter)) for info in CATALOG}


def supported_families() -> list[str]:
    return sorted({family.adapter.family for family in _FAMILIES.values()})


def supported_model_types() -> list[str]:
    """The ``model_type`` values of config.json that load: full checkpoints and standalone towers."""
    return sorted(_FAMILIES)


# "Qwen/Qwen2-VL-7B-Instruct": what a user passes when they expect a download.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def check_checkpoint(checkpoint: Path | str) -> None:
    """Fail with one clear :class:`CheckpointError` if ``checkpoint`` cannot be served, reading no weights.

    What a server can know before it binds its port: the directory, its configs, the family, the
    weight files. Whether the weights fit the config is only known while they load.
    """
    _family_of(Path(checkpoint))


def _family_of(checkpoint: Path) -> _Family:
    if not checkpoint.exists():
        text = str(checkpoint)
        if _HUB_ID.fullmatch(text):
            local = "./" + text.rsplit("/", 1)[1]
            raise CheckpointError(
                f"{text} is not a local directory; mmencode downloads nothing and loads save_pretrained "
                f"directories only. If it is a Hugging Face model id, download it first: "
                f'`hf download {text} --include "*.json" "*.safetensors" --local-dir {local}` '
                "(older huggingface_hub: `huggingface-cli download`; the include patterns skip pickled weights), "
                f"then pass --model {local}"
            )
        raise CheckpointError(f"{checkpoint} does not exist; --model takes a local save_pretrained directory")
    if not checkpoint.is_dir():
        raise CheckpointError(f"{checkpoint} is a file; --model takes a local save_pretrained directory")
    model_type = str(load_config_json(checkpoint).get("model_type"))
    family = _FAMILIES.get(model_type)
    if family is None:
        raise CheckpointError(
            f"model_type {model_type!r} in {checkpoint}/config.json is not supported; supported: {sorted(_FAMILIES)} "
            "(a full VLM checkpoint of one of these, or its vision tower alone)"
        )
    if family.info.torchvision_only:
        require_torchvision(model_type)  # a dependency this process lacks cannot appear later
    if not any((checkpoint / name).is_file() for name in ("preprocessor_config.json", "processor_config.json")):
        raise CheckpointError(
            f"{checkpoint} has no preprocessor_config.json or processor_config.json: the image processor is "
            "required (download the checkpoint's processor files too, not only the weights)"
        )
    weight_files(checkpoint)
    return family


def load_encoder(
    checkpoint: Path | str,
    *,
    device: torch.device,
    dtype: torch.dtype,
    image_processor_backend: BackendChoice = "auto",
) -> EncoderAdapter:
    """Build the encoder of a local ``save_pretrained`` directory on ``device``; never the language model.

    ``image_processor_backend`` ``auto`` preprocesses as transformers and vLLM do by default: with the
    torchvision image processor where torchvision imports, else the PIL one.
    """
    checkpoint = Path(checkpoint)
    family = _family_of(checkpoint)
    adapter_cls = family.adapter
    backend = resolve_backend(image_processor_backend)
    config = adapter_cls.load_config(checkpoint)
    tower_config = family.tower_config(config)
    processor_config = adapter_cls.load_processor_config(checkpoint, config)
    processor: Any = adapter_cls.build_processor(processor_config, backend)

    module: torch.nn.Module = adapter_cls.tower_class(tower_config)
    hasher = blake3.blake3()
    hasher.update(adapter_cls.family.encode())
    # The files as shipped, not re-serialised configs: the same on every replica and library version.
    for path in (checkpoint / "config.json", *processor_config.files):
        hasher.update(path.read_bytes())
    layout = load_encoder_weights(module, checkpoint, adapter_cls.weight_prefixes, hasher, adapter_cls.key_maps)
    # The compute dtype and the kind of device change the rows too (bf16 vs fp32; GPU vs CPU kernels):
    # a content hash is handed to vLLM as the item's `uuid`, so it must never name two sets of rows.
    # So does the image processor's backend (PIL and torchvision resample differently).
    hasher.update(f"compute:{dtype};device:{device.type};preprocess:{backend}".encode())
    module.requires_grad_(False)
    module.to(device=device, dtype=dtype).eval()
    logger.info(
        "loaded %s encoder from %s (weights under %s) on %s as %s, %s image processor",
        adapter_cls.family,
        checkpoint,
        layout,
        device,
        dtype,
        backend,
    )
    video_processor, video_fingerprint = (
        load_video_processor(checkpoint, adapter_cls.video_processor_class)
        if adapter_cls.video_processor_class is not None
        else (None, "")
    )
    return adapter_cls(
        module,
        processor,
        tower_config,
        checkpoint=checkpoint,
        device=device,
        dtype=dtype,
        fingerprint=hasher.hexdigest(),
        processor_config=processor_config,
        image_processor_backend=backend,
        video_processor=video_processor,
        video_fingerprint=video_fingerprint,
    )
