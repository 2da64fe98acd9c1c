"""Encoder adapters: one file per vision-encoder family, all behind :class:`models.base.EncoderAdapter`.

This package never imports ``app`` or ``schemas``: it knows checkpoints and tensors, not HTTP.
"""

from models.base import EncoderAdapter, EncoderOutput, PreparedImage
from models.errors import CheckpointError, MetadataError
from models.registry import check_checkpoint, load_encoder, supported_families

__all__ = [
    "CheckpointError",
    "EncoderAdapter",
    "EncoderOutput",
    "MetadataError",
    "PreparedImage",
    "check_checkpoint",
    "load_encoder",
    "supported_families",
]
