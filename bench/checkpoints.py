"""Benchmark checkpoints: the tiny default, and a mid-size Qwen2-VL tower where the encoder dominates.

The mid-size tower (6 blocks, width 320, ~8.5M parameters) on 336x336 images (576 patches, 144 rows)
costs enough per image on a CPU (bench/README.md has the figures) that HTTP, base64 and preprocessing
are small beside the forward, as they are beside a real tower on a GPU.

:func:`servable_checkpoint` writes the same towers as whole VLMs an LLM server loads too (SGLang's and
vLLM's encoders need the config, tokenizer and processor of a servable checkpoint), so a peer and
mmencode serve the one directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessorPil, Qwen2VLVisionConfig
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel
from transformers.utils import logging as hf_logging

from mmencode.models.tiny import TinyProcessor, build_tiny, fill_deterministic
from mmencode.models.tiny.common import TEXT_CONFIG, replaced_atomically
from mmencode.models.tiny.servable import SERVABLE, servable_model, write_servable_files

__all__ = ["SERVABLE_KINDS", "build_checkpoint", "qwen2_vl_tower", "servable_checkpoint"]

# The mid tower's geometry (bench/README.md: "Checkpoints"), its pixel budget: up to 336x336 (144 rows).
_MID_VISION: dict[str, Any] = {
    "depth": 6, "embed_dim": 320, "num_heads": 5, "hidden_size": 512, "mlp_ratio": 4,
    "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
}  # fmt: skip
_MID_PIXELS = (56 * 56, 336 * 336)
# servable_checkpoint's kinds: the family each is, and whether it carries the mid tower.
SERVABLE_KINDS = {"tiny": "qwen2_vl", "mid": "qwen2_vl", "qwen2_5_vl": "qwen2_5_vl", "qwen3_vl": "qwen3_vl"}


def qwen2_vl_tower(directory: Path, config: Qwen2VLVisionConfig, *, min_pixels: int, max_pixels: int) -> Path:
    """A Qwen2-VL vision tower of ``config`` with deterministic weights and its processor, saved to ``directory``."""
    model = Qwen2VisionTransformerPretrainedModel(config)
    fill_deterministic(model)
    processor = Qwen2VLImageProcessorPil(
        size={"shortest_edge": min_pixels, "longest_edge": max_pixels},
        patch_size=config.patch_size,
        temporal_patch_size=config.temporal_patch_size,
        merge_size=config.spatial_merge_size,
    )
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    return directory


def _build_mid(directory: Path) -> Path:
    config = Qwen2VLVisionConfig(**_MID_VISION)
    return qwen2_vl_tower(directory, config, min_pixels=_MID_PIXELS[0], max_pixels=_MID_PIXELS[1])


def _build_servable_mid(directory: Path) -> Path:
    """The mid tower inside a servable Qwen2-VL: a one-layer language model as wide as the tower's merger
    (512) that the encoders never run, the servable tokenizer and template, the mid pixel budget."""
    text = {**TEXT_CONFIG, "hidden_size": _MID_VISION["hidden_size"], "intermediate_size": 1024}
    text["rope_scaling"] = {"type": "mrope", "mrope_section": [2, 3, 3]}  # scaled to the head size
    spec = SERVABLE["qwen2_vl"]
    model = servable_model(
        Qwen2VLForConditionalGeneration(Qwen2VLConfig(text_config=text, vision_config=_MID_VISION)), spec
    )
    fill_deterministic(model)
    processor = Qwen2VLImageProcessorPil(
        size={"shortest_edge": _MID_PIXELS[0], "longest_edge": _MID_PIXELS[1]},
        patch_size=14, temporal_patch_size=2, merge_size=2,
    )  # fmt: skip
    tiny_processor = TinyProcessor(processor, "Qwen2VLProcessor")
    hf_logging.disable_progress_bar()
    with replaced_atomically(directory) as staging:
        model.save_pretrained(staging)
        tiny_processor.save(staging, tiny_processor.default_layout)
        write_servable_files(staging, spec, tiny_processor.processor_class)
    return directory


def servable_checkpoint(kind: str, root: Path) -> Path:
    """A checkpoint an LLM server and mmencode both serve, under ``root``: ``tiny`` (the tiny Qwen2-VL),
    ``mid`` (the mid tower in a Qwen2-VL), ``qwen2_5_vl`` or ``qwen3_vl`` (their tiny ones)."""
    directory = root / f"servable-{kind}"
    if (directory / "tokenizer_config.json").is_file():  # written last
        return directory
    if kind == "mid":
        return _build_servable_mid(directory)
    if kind not in SERVABLE_KINDS:
        raise ValueError(f"unknown servable checkpoint {kind!r}; choose from {sorted(SERVABLE_KINDS)}")
    return build_tiny(directory, SERVABLE_KINDS[kind], layout="servable", overwrite=True)


def build_checkpoint(kind: str, root: Path) -> Path:
    """``tiny`` (the embedded default), ``mid`` (encoder-bound) or ``clip`` (tiny full CLIPModel)."""
    directory = root / kind
    if (directory / "config.json").is_file():
        return directory
    if kind == "mid":
        return _build_mid(directory)
    if kind == "tiny":
        return build_tiny(directory, "qwen2_vl", overwrite=True)
    if kind == "clip":
        return build_tiny(directory, "clip", overwrite=True)
    raise ValueError(f"unknown checkpoint kind {kind!r}")
