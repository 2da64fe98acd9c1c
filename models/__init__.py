"""Encoder adapters: one file per vision-encoder family, all behind :class:`models.base.EncoderAdapter`.

This package never imports ``app`` or ``schemas``: it knows checkpoints and tensors, not HTTP. Its
names are imported on first use, so ``models.catalog`` (plain data for ``--help``) costs no torch import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from models.base import EncoderAdapter, EncoderOutput, PreparedImage
    from models.errors import CheckpointError, MetadataError
    from models.registry import load_encoder, supported_families

_HOMES = {
    "CheckpointError": "models.errors",
    "EncoderAdapter": "models.base",
    "EncoderOutput": "models.base",
    "MetadataError": "models.errors",
    "PreparedImage": "models.base",
    "load_encoder": "models.registry",
    "supported_families": "models.registry",
}

__all__ = [
    "CheckpointError",
    "EncoderAdapter",
    "EncoderOutput",
    "MetadataError",
    "PreparedImage",
    "load_encoder",
    "supported_families",
]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'models' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
