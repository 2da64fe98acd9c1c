"""A checkpoint's video processor: where its settings are, and the transformers class that runs them.

transformers 5 reads a video processor's settings from, in order: the ``"video_processor"`` entry of
``processor_config.json``, ``video_preprocessor_config.json``, then ``preprocessor_config.json`` (older
repos keep one file for both). The same order here, so a clip is preprocessed as the checkpoint's own
``AutoProcessor`` preprocesses it. Video processors exist only on torchvision: without it, a family that
takes videos serves images only, and says so.

``cap_pixels_per_frame`` (Qwen2-VL's per-frame pixel cap, off by default in transformers 5.24 with a
warning that the default will flip) is pinned to the checkpoint's value, else ``False``: the rows of a
clip must not change with the transformers release.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import blake3
import transformers

from mmencode.models.errors import CheckpointError
from mmencode.models.optional import torchvision_problem
from mmencode.models.processor_config import PREPROCESSOR_FILE, PROCESSOR_FILE, read_json_object

__all__ = ["VIDEO_PROCESSOR_FILE", "load_video_processor"]

logger = logging.getLogger("mmencode.models")

VIDEO_PROCESSOR_FILE = "video_preprocessor_config.json"


def load_video_processor(checkpoint: Path, class_name: str) -> tuple[Any | None, str]:
    """``(video processor, fingerprint of its settings)``; ``(None, "")`` where torchvision is missing."""
    problem = torchvision_problem()
    if problem is not None:
        logger.warning("%s serves images only: video processors need torchvision (%s)", checkpoint, problem)
        return None, ""
    found = _settings(checkpoint)
    if found is None:
        logger.warning("%s serves images only: it has no video processor settings", checkpoint)
        return None, ""
    settings, source = found
    settings = {key: value for key, value in settings.items() if value is not None}
    settings.setdefault("cap_pixels_per_frame", False)
    processor_class = getattr(transformers, class_name, None)
    if not isinstance(processor_class, type):
        raise CheckpointError(f"transformers {transformers.__version__} has no {class_name}")
    try:
        processor = processor_class.from_dict(settings)  # type: ignore[attr-defined]
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{source} is not a {class_name} configuration: {exc}") from exc
    fingerprint = blake3.blake3(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest(length=16)
    return processor, f"{class_name}:{fingerprint}"


def _settings(checkpoint: Path) -> tuple[dict[str, Any], Path] | None:
    nested = checkpoint / PROCESSOR_FILE
    if nested.is_file():
        video = read_json_object(nested).get("video_processor")
        if isinstance(video, dict):
            return dict(video), nested
    for name in (VIDEO_PROCESSOR_FILE, PREPROCESSOR_FILE):
        path = checkpoint / name
        if path.is_file():
            return read_json_object(path), path
    return None
