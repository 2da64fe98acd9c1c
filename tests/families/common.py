"""Shared pieces of the family references: the spec, bare processors, a tiny tokenizer, config edits."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    PreTrainedTokenizerFast,
)

from mmencode.models import EncoderAdapter

__all__ = ["FamilySpec", "bare_processor", "edit_processor", "tiny_tokenizer"]


def bare_processor(processor_class: type, **attributes: Any) -> Any:
    """A processor instance without ``__init__`` (which needs a tokenizer and, here, torchvision)."""
    processor = processor_class.__new__(processor_class)
    for name, value in attributes.items():
        setattr(processor, name, value)
    return processor


def tiny_tokenizer(**special: str) -> PreTrainedTokenizerFast:
    """A word-level tokenizer knowing a family's special tokens (``image_token="<image>"``...)."""
    words = ["<unk>", "<pad>", "a", *special.values()]
    backend = Tokenizer(models.WordLevel({word: i for i, word in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens(list(special.values()))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>", extra_special_tokens=special
    )


def edit_processor(src: Path, dst: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of ``src`` whose nested image-processor settings went through ``edit``."""
    shutil.copytree(src, dst)
    whole = json.loads((dst / "processor_config.json").read_text())
    edit(whole)
    (dst / "processor_config.json").write_text(json.dumps(whole))
    return dst


@dataclass(frozen=True)
class FamilySpec:
    family: str
    # The metadata a precomputed item must carry, and that every encoded item reports.
    required: tuple[str, ...]
    # (checkpoint, images, adapter) -> rows per image, from the full transformers model.
    reference: Callable[[Path, list[Image.Image], EncoderAdapter], list[torch.Tensor]]
    # (adapter, image) -> placeholder tokens the family's own processor inserts for it.
    placeholders: Callable[[EncoderAdapter, Image.Image], int]
    # (good checkpoint, destination) -> a checkpoint whose processor config disagrees with its model;
    # None where one file holds both sides' settings, so they cannot disagree.
    drifting: Callable[[Path, Path], Path] | None
