"""Benchmark checkpoints: the tiny default, and a mid-size Qwen2-VL tower where the encoder dominates.

The mid-size tower (6 blocks, width 320, ~8.5M parameters) on 336x336 images (576 patches, 144 rows)
costs enough per image on a CPU (bench/README.md has the figures) that HTTP, base64 and preprocessing
are small beside the forward, as they are beside a real tower on a GPU.
"""

from __future__ import annotations

from pathlib import Path

from transformers import Qwen2VLImageProcessorPil, Qwen2VLVisionConfig
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

from mmencode.models.tiny import build_tiny, fill_deterministic

__all__ = ["build_checkpoint", "qwen2_vl_tower"]


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
    config = Qwen2VLVisionConfig(
        depth=6, embed_dim=320, num_heads=5, hidden_size=512, mlp_ratio=4,
        patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
    )  # fmt: skip
    return qwen2_vl_tower(directory, config, min_pixels=56 * 56, max_pixels=336 * 336)


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
