"""Exceptions raised by the model layer; the app maps them to its own error codes."""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint directory cannot be served: unknown family, missing files, or weights that do not fit."""


class MetadataError(ValueError):
    """An item's metadata is absent or malformed for this family (e.g. no ``num_patches`` for InternVL)."""

    def __init__(self, field: str, reason: str, *, missing: bool) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason
        self.missing = missing


class UnsupportedModalityError(ValueError):
    """This family (or this checkpoint, lacking a video processor) does not encode the item's modality."""
