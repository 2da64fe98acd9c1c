"""Encoder adapters: one file per vision-encoder family, all behind :class:`models.base.EncoderAdapter`.

This package never imports ``app`` or ``schemas``: it knows checkpoints and tensors, not HTTP. Its
names are imported on first use, so ``models.catalog`` (plain data for ``--help``) costs no torch import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mmencode.models.base import EncoderAdapter, EncoderOutput, PreparedItem
    from mmencode.models.errors import CheckpointError, MetadataError
    from mmencode.models.registry import check_checkpoint, load_encoder, supported_families

# Name -> the submodule that defines it, relative to this package.
_HOMES = {
    "CheckpointError": ".errors",
    "EncoderAdapter": ".base",
    "EncoderOutput": ".base",
    "MetadataError": ".errors",
    "PreparedItem": ".base",
    "check_checkpoint": ".registry",
    "load_encoder": ".registry",
    "supported_families": ".registry",
}

__all__ = [
    "CheckpointError",
    "EncoderAdapter",
    "EncoderOutput",
    "MetadataError",
    "PreparedItem",
    "check_checkpoint",
    "load_encoder",
    "supported_families",
]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name], __name__), name)
