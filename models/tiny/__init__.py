"""Deterministic tiny checkpoints of every family, in the layouts users download.

Weights are drawn per tensor from a generator seeded by the tensor's name, so a checkpoint is the same
on every torch/transformers version whatever order layers are constructed in. The result is a normal
``save_pretrained`` directory (config, safetensors, processor config) loaded by the same path as a
real model. Full-VLM layouts include a (tiny) language model that the service must never load.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import PreTrainedModel
from transformers.utils import logging as hf_logging

from mmencode.models.catalog import CATALOG
from mmencode.models.tiny.common import (
    Layout,
    ProcessorLayout,
    TinyProcessor,
    fill_deterministic,
    replaced_atomically,
)
from mmencode.models.tiny.internvl import to_opengvlab_layout
from mmencode.models.tiny.servable import SERVABLE, servable_model, write_servable_files

__all__ = ["FAMILIES", "Layout", "ProcessorLayout", "TinyProcessor", "build_tiny", "fill_deterministic"]

Builder = Callable[[Layout, int], tuple[PreTrainedModel, TinyProcessor]]


def _builder(path: str) -> Builder:
    module, name = path.split(":")
    builder: Builder = getattr(importlib.import_module(f"mmencode.models.tiny.{module}"), name)
    return builder


# The tiny builders models/catalog.py names, by model_type.
FAMILIES: dict[str, Builder] = {info.model_type: _builder(info.tiny) for info in CATALOG if info.tiny is not None}


def build_tiny(
    directory: Path | str,
    family: str = "qwen2_vl",
    *,
    layout: Layout = "full",
    processor_merge_size: int = 2,
    processor_layout: ProcessorLayout | None = None,
    max_shard_size: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a tiny checkpoint of ``family`` to ``directory`` and return it.

    ``layout``: ``full`` (the VLM), ``vision`` (the tower alone, where the family has one) or
    ``servable``: the full VLM plus what an LLM server needs to serve it (tokenizer with the family's
    special tokens, chat template, the whole processor, room for the rows; models/tiny/servable.py).
    ``processor_layout`` defaults to the family's own (``nested`` for families added with
    transformers 5); ``max_shard_size`` (e.g. ``"20KB"``) writes sharded safetensors with an index.
    A directory that holds anything is refused (``FileExistsError``) unless ``overwrite``: it could be a
    real checkpoint. With ``overwrite`` it is replaced atomically.
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; choose from {sorted(FAMILIES)}")
    directory = Path(directory)
    if not overwrite and (directory.is_file() or (directory.is_dir() and any(directory.iterdir()))):
        raise FileExistsError(f"{directory} exists and is not empty")
    if layout == "servable" and family not in SERVABLE:
        raise ValueError(f"family {family!r} has no servable layout; choose from {sorted(SERVABLE)}")
    # Seeded, as the checkpoints always were, in a fork of the global RNG: the caller's stream is untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # construction-time init is overwritten below; this only keeps it quiet
        model, processor = FAMILIES[family]("full" if layout == "servable" else layout, processor_merge_size)
        if layout == "servable":
            model = servable_model(model, SERVABLE[family])
        fill_deterministic(model)
    hf_logging.disable_progress_bar()
    with replaced_atomically(directory) as staging:
        if max_shard_size is None:
            model.save_pretrained(staging)
        else:
            model.save_pretrained(staging, max_shard_size=max_shard_size)
        processor.save(staging, processor_layout or processor.default_layout)
        if layout == "servable":
            write_servable_files(staging, SERVABLE[family], processor.processor_class)
        if family == "internvl_chat":
            to_opengvlab_layout(staging)
        _make_readable(staging)
    return directory


def _make_readable(directory: Path) -> None:
    """Modes of a downloaded checkpoint (755/644), not mkdtemp's 700: a container running as another
    user (the image's uid 10001) reads the directory through a read-only volume."""
    directory.chmod(0o755)
    for path in directory.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
