"""What every tiny checkpoint builder shares: layouts, small configs, the processor writer, seeded weights."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

__all__ = [
    "CLIP_MEAN",
    "CLIP_STD",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "QWEN3_TOKENS",
    "TEXT_CONFIG",
    "Layout",
    "ProcessorLayout",
    "TinyProcessor",
    "fill_deterministic",
]

# "servable": the full VLM plus a tokenizer, chat template and whole processor (models/tiny/servable.py).
Layout = Literal["full", "vision", "servable"]
# "nested": one processor_config.json with the image processor inside, as transformers 5 saves a whole
# processor; "legacy": preprocessor_config.json (plus processor_config.json for processor-level settings).
ProcessorLayout = Literal["nested", "legacy"]

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
QWEN3_TOKENS: dict[str, Any] = {
    "image_token_id": 10,
    "video_token_id": 11,
    "vision_start_token_id": 12,
    "vision_end_token_id": 13,
}
IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]
TEXT_CONFIG: dict[str, Any] = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 128,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


@dataclass(frozen=True)
class TinyProcessor:
    """What a family's whole processor saves, without the tokenizer the encoder never needs.

    The whole-processor classes of several families cannot be built without torchvision (they bundle a
    video processor), so the file is written here in the format ``ProcessorMixin.save_pretrained`` uses.
    """

    image_processor: Any
    processor_class: str
    # Processor-level settings: image_seq_length, num_image_tokens...
    settings: dict[str, Any] = field(default_factory=dict)
    default_layout: ProcessorLayout = "legacy"
    # The class name the hub repos write (e.g. a torchvision "...Fast" class); None keeps transformers'.
    image_processor_type: str | None = None
    # Its key inside a nested processor_config.json: an audio model's is its "feature_extractor".
    component: str = "image_processor"

    def save(self, directory: Path, layout: ProcessorLayout) -> None:
        whole = {**self.settings, "processor_class": self.processor_class}
        image_processor = self.image_processor.to_dict()
        if self.image_processor_type is not None:
            image_processor["image_processor_type"] = self.image_processor_type
        if layout == "nested":
            whole = {self.component: image_processor, **whole}
        else:
            if self.image_processor_type is None:
                self.image_processor.save_pretrained(directory)
            else:
                (directory / "preprocessor_config.json").write_text(json.dumps(image_processor, indent=2) + "\n")
            if not self.settings:
                return
        (directory / "processor_config.json").write_text(json.dumps(whole, indent=2, sort_keys=True) + "\n")


def fill_deterministic(model: torch.nn.Module) -> None:
    """Overwrite every parameter with values seeded by its name (stable across library versions)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            # transformers moved towers under "model." (4.52); the seed must not follow such moves.
            canonical = name.removeprefix("model.")
            seed = int.from_bytes(hashlib.blake2b(canonical.encode(), digest_size=8).digest(), "little")
            values = np.asarray(
                np.random.default_rng(seed).standard_normal(tuple(param.shape), dtype=np.float32), dtype=np.float32
            )
            if param.ndim == 1 and ("norm" in name or name.endswith("ln_1.weight")):
                values = 1.0 + 0.1 * values  # norm scales around one keep activations alive
            elif param.ndim == 1:
                values = 0.02 * values
            else:
                values = values / np.sqrt(max(1, int(np.prod(param.shape[1:]))))
            param.copy_(torch.as_tensor(values, dtype=torch.float32))


@contextlib.contextmanager
def replaced_atomically(directory: Path) -> Iterator[Path]:
    """A fresh folder beside ``directory`` to write into; it becomes ``directory``, whole, if the block
    succeeds, and is removed if it raises, so a reader never sees a half-written checkpoint."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
    try:
        yield staging
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(staging, directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
