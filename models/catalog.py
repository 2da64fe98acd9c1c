"""What each supported ``model_type`` needs and yields, as plain data: the CLI's help and the README
table read it without importing torch (the registry checks that it lists exactly what it serves)."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["CATALOG", "TINY_FAMILIES", "TORCHVISION_MODEL_TYPES", "FamilyInfo", "catalog_text"]


class FamilyInfo(NamedTuple):
    model_type: str
    metadata: str  # fields a precomputed item must carry ("-" when none)
    rows: str  # how the rows of one image are counted


_QWEN2 = ("image_grid_thw", "`t*h*w / merge_size**2`")
_FIXED = ("-", "patches per side squared")
_CROP_GRID = ("crop_grid", "`(rows * cols + 1) * image_seq_len` (crops + global view; `image_seq_len` without a grid)")

CATALOG: tuple[FamilyInfo, ...] = (
    FamilyInfo("qwen2_vl", *_QWEN2),
    FamilyInfo("qwen2_vl_vision", *_QWEN2),
    FamilyInfo("qwen2_5_vl", *_QWEN2),
    FamilyInfo("qwen2_5_vl_vision", *_QWEN2),
    FamilyInfo(
        "qwen3_vl",
        "image_grid_thw",
        "`t*h*w / merge_size**2`; width `out_hidden_size * (1 + DeepStack levels)`, "
        "`[main | level_0 | ...]` (metadata `deepstack_split`)",
    ),
    FamilyInfo("qwen3_5", *_QWEN2),
    FamilyInfo("glm4v", *_QWEN2),
    FamilyInfo(
        "kimi_k25",
        "image_grid_thw",
        "`h*w / merge_size**2` of the padded patch grid (needs torchvision)",
    ),
    FamilyInfo(
        "gemma3",
        "num_crops (when pan-and-scan is on)",
        "`(1 + num_crops) * image_seq_length` (pooled SigLIP views)",
    ),
    FamilyInfo("idefics3", *_CROP_GRID),
    FamilyInfo("smolvlm", *_CROP_GRID),
    FamilyInfo(
        "step3p7",
        "num_patches",
        "`num_patches * rows_per_crop + rows_per_global`, each view `(side // 56)**2` (local crops, then the "
        "global view; needs torchvision)",
    ),
    FamilyInfo(
        "mistral3",
        "image_sizes",
        "`(h // (patch * merge)) * (w // (patch * merge))` of the processed `[h, w]` ([IMG_BREAK]/[IMG_END] are text)",
    ),
    FamilyInfo(
        "llava_next",
        "image_sizes",
        "base tile + unpadded any-resolution map + one newline row per map row",
    ),
    FamilyInfo(
        "llava_onevision",
        "image_sizes",
        "base tile + unpadded any-resolution map (shrunk to anyres_max_N tiles) + one newline row per map row",
    ),
    FamilyInfo("internvl", "num_patches", "`num_patches * rows_per_tile` (tiles + thumbnail)"),
    FamilyInfo(
        "internvl_chat",
        "num_patches",
        "`num_patches * rows_per_tile` (OpenGVLab layout; tiling from config.json's dynamic_preprocess settings)",
    ),
    FamilyInfo("siglip", *_FIXED),
    FamilyInfo("siglip_vision_model", *_FIXED),
    FamilyInfo("clip", "-", "patches per side squared + 1 class token"),
    FamilyInfo("clip_vision_model", "-", "patches per side squared + 1 class token"),
)

# Families ``mmencode make-tiny`` builds (models.tiny.FAMILIES, kept equal by a test).
TINY_FAMILIES: tuple[str, ...] = (
    "clip",
    "gemma3",
    "glm4v",
    "idefics3",
    "internvl",
    "internvl_chat",
    "kimi_k25",
    "llava_next",
    "llava_onevision",
    "mistral3",
    "qwen2_vl",
    "qwen2_5_vl",
    "qwen3_5",
    "qwen3_vl",
    "siglip",
    "smolvlm",
    "step3p7",
)

# Families whose image processor transformers implements only with torchvision (models.optional).
TORCHVISION_MODEL_TYPES: tuple[str, ...] = ("kimi_k25", "step3p7")


def catalog_text() -> str:
    """One line per model_type, for ``mmencode serve --help``."""
    width = max(len(info.model_type) for info in CATALOG)
    lines = [f"  {info.model_type:<{width}}  metadata: {info.metadata}; rows: {info.rows}" for info in CATALOG]
    return "supported model_type values (config.json):\n" + "\n".join(line.replace("`", "") for line in lines)
