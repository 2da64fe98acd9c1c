"""Where a checkpoint keeps its processor settings, in the layouts real downloads have.

Three layouts occur:

- transformers 4 and most hub repos: ``preprocessor_config.json`` holds the image processor's settings;
- transformers 5 saves a whole processor as ``processor_config.json`` with the image processor nested
  under ``"image_processor"`` beside processor-level settings (``image_seq_length``...), and no
  ``preprocessor_config.json`` at all;
- both files side by side (Gemma 3's repos: a ``preprocessor_config.json`` with ``null`` values beside
  a ``processor_config.json`` holding only ``image_seq_length``).

The nested image processor wins over ``preprocessor_config.json``, as in transformers' own loader.
``null`` values are dropped, so the processor class's defaults apply: that is what the repos that
write them mean, and an explicit ``None`` breaks the PIL processors. The class named by
``image_processor_type`` is never imported: each adapter builds its family's PIL processor from these
settings, so a config naming a torchvision-backed class (``Qwen2VLImageProcessorFast``) loads on a
machine without torchvision.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmencode.models.errors import CheckpointError

__all__ = ["PREPROCESSOR_FILE", "PROCESSOR_FILE", "ProcessorConfig", "read_json_object", "read_processor_config"]

PREPROCESSOR_FILE = "preprocessor_config.json"
PROCESSOR_FILE = "processor_config.json"


@dataclass(frozen=True)
class ProcessorConfig:
    """A checkpoint's image-processor settings and its processor-level settings."""

    image_processor: dict[str, Any]
    # Settings of the whole processor (``image_seq_length``, ``num_image_tokens``...), without the nested
    # image processor; empty when the checkpoint has no processor_config.json.
    processor: dict[str, Any] = field(default_factory=dict)
    # The files these came from, in a fixed order: the content hash fingerprints their bytes.
    files: tuple[Path, ...] = ()

    def setting(self, name: str, default: Any = None) -> Any:
        """A processor-level setting; older saves keep some of them in the image processor's file."""
        for source in (self.processor, self.image_processor):
            if source.get(name) is not None:
                return source[name]
        return default


def read_json_object(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is not readable JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    return data


def _without_nulls(settings: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in settings.items() if value is not None}


def read_processor_config(checkpoint: Path, component: str = "image_processor") -> ProcessorConfig:
    """The processor settings of a ``save_pretrained`` directory, whichever layout saved them.

    ``component`` is the part a family preprocesses with: ``image_processor``, or an audio model's
    ``feature_extractor`` (its settings then stand where an image processor's would).
    """
    files = tuple(checkpoint / name for name in (PREPROCESSOR_FILE, PROCESSOR_FILE) if (checkpoint / name).is_file())
    processor: dict[str, Any] = {}
    nested: Any = None
    if (checkpoint / PROCESSOR_FILE).is_file():
        processor = read_json_object(checkpoint / PROCESSOR_FILE)
        nested = processor.pop(component, None)
    if isinstance(nested, dict):
        image_processor = nested
    elif (checkpoint / PREPROCESSOR_FILE).is_file():
        image_processor = read_json_object(checkpoint / PREPROCESSOR_FILE)
    else:
        what = component.replace("_", " ")
        raise CheckpointError(
            f"{checkpoint} has no {what} settings: neither {PREPROCESSOR_FILE} nor an "
            f'"{component}" entry in {PROCESSOR_FILE}; the {what} is required'
        )
    return ProcessorConfig(_without_nulls(image_processor), _without_nulls(processor), files)
