"""Every supported ``model_type`` in one place, as plain data: which adapter serves it, where its tower's
config sits, what a precomputed item must carry, how its rows are counted, and which tiny builder makes
a test checkpoint of it. The registry, ``serve --help``, ``make-tiny`` and the family tests read this
table; a new family is its adapter file, its tiny builder and one entry here. Names, not imports: the
CLI's help reads it without importing torch.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

__all__ = ["CATALOG", "TINY_FAMILIES", "TORCHVISION_MODEL_TYPES", "FamilyInfo", "catalog_text"]


class FamilyInfo(NamedTuple):
    model_type: str
    # "module:Class" under mmencode.models: the EncoderAdapter serving it.
    adapter: str
    # Where the tower is built from: config.json's ``vision_config``, or the whole config (a standalone
    # tower, or a family whose projector needs the language width).
    tower_config: Literal["vision_config", "whole"]
    metadata: str  # fields a precomputed item must carry ("-" when none)
    rows: str  # how the rows of one image are counted
    # "module:function" under mmencode.models.tiny building a tiny checkpoint; None for a layout that
    # another entry's builder writes (a standalone tower: ``make-tiny --layout vision``).
    tiny: str | None = None
    # transformers implements its image processor only with torchvision (models.optional).
    torchvision_only: bool = False


_QWEN2 = ("image_grid_thw", "`t*h*w / merge_size**2`")
_FIXED = ("-", "patches per side squared")
_CROP_GRID = ("crop_grid", "`(rows * cols + 1) * image_seq_len` (crops + global view; `image_seq_len` without a grid)")
_CLS = ("-", "patches per side squared + 1 class token")
_AUDIO = (
    "audio_feature_length (audio items)",
    "per clip of `L` mel frames (100 a second, at most 3000): `((L - 1) // 2 + 1 - 2) // 2 + 1`; audio only",
)

CATALOG: tuple[FamilyInfo, ...] = (
    FamilyInfo("qwen2_vl", "qwen2_vl:Qwen2VLAdapter", "vision_config", *_QWEN2, tiny="qwen:qwen2_vl"),
    FamilyInfo("qwen2_vl_vision", "qwen2_vl:Qwen2VLAdapter", "whole", *_QWEN2),
    FamilyInfo("qwen2_5_vl", "qwen2_vl:Qwen2_5_VLAdapter", "vision_config", *_QWEN2, tiny="qwen:qwen2_5_vl"),
    FamilyInfo("qwen2_5_vl_vision", "qwen2_vl:Qwen2_5_VLAdapter", "whole", *_QWEN2),
    FamilyInfo(
        "qwen3_vl",
        "qwen3_vl:Qwen3VLAdapter",
        "vision_config",
        "image_grid_thw",
        "`t*h*w / merge_size**2`; width `out_hidden_size * (1 + DeepStack levels)`, "
        "`[main | level_0 | ...]` (metadata `deepstack_split`)",
        tiny="qwen:qwen3_vl",
    ),
    FamilyInfo("qwen3_5", "qwen3_vl:Qwen3_5Adapter", "vision_config", *_QWEN2, tiny="qwen:qwen3_5"),
    FamilyInfo("glm4v", "glm4v:Glm4vAdapter", "vision_config", *_QWEN2, tiny="qwen:glm4v"),
    FamilyInfo(
        "kimi_k25",
        "kimi:KimiAdapter",
        "whole",
        "image_grid_thw",
        "`h*w / merge_size**2` of the padded patch grid (needs torchvision)",
        tiny="step3_kimi:kimi_k25",
        torchvision_only=True,
    ),
    FamilyInfo(
        "gemma3",
        "gemma3:Gemma3Adapter",
        "whole",
        "num_crops (when pan-and-scan is on)",
        "`(1 + num_crops) * image_seq_length` (pooled SigLIP views)",
        tiny="llava:gemma3",
    ),
    FamilyInfo("idefics3", "idefics3:Idefics3Adapter", "whole", *_CROP_GRID, tiny="llava:idefics3"),
    FamilyInfo("smolvlm", "idefics3:SmolVLMAdapter", "whole", *_CROP_GRID, tiny="llava:smolvlm"),
    FamilyInfo(
        "step3p7",
        "step3:Step3Adapter",
        "whole",
        "num_patches",
        "`num_patches * rows_per_crop + rows_per_global`, each view `(side // 56)**2` (local crops, then the "
        "global view; needs torchvision)",
        tiny="step3_kimi:step3p7",
        torchvision_only=True,
    ),
    FamilyInfo(
        "mistral3",
        "mistral3:Mistral3Adapter",
        "whole",
        "image_sizes",
        "`(h // (patch * merge)) * (w // (patch * merge))` of the processed `[h, w]` ([IMG_BREAK]/[IMG_END] are text)",
        tiny="llava:mistral3",
    ),
    FamilyInfo(
        "llava_next",
        "llava_next:LlavaNextAdapter",
        "whole",
        "image_sizes",
        "base tile + unpadded any-resolution map + one newline row per map row",
        tiny="llava:llava_next",
    ),
    FamilyInfo(
        "llava_onevision",
        "llava_onevision:LlavaOnevisionAdapter",
        "whole",
        "image_sizes",
        "base tile + unpadded any-resolution map (shrunk to anyres_max_N tiles) + one newline row per map row",
        tiny="llava:llava_onevision",
    ),
    FamilyInfo(
        "internvl",
        "internvl:InternVLAdapter",
        "whole",
        "num_patches",
        "`num_patches * rows_per_tile` (tiles + thumbnail)",
        tiny="internvl:internvl",
    ),
    FamilyInfo(
        "internvl_chat",
        "internvl:InternVLChatAdapter",
        "whole",
        "num_patches",
        "`num_patches * rows_per_tile` (OpenGVLab layout; tiling from config.json's dynamic_preprocess settings)",
        tiny="internvl:internvl_chat",
    ),
    FamilyInfo("qwen2_audio", "qwen2_audio:Qwen2AudioAdapter", "whole", *_AUDIO, tiny="audio:qwen2_audio"),
    FamilyInfo("qwen2_5_omni", "qwen2_audio:Qwen2_5OmniAudioAdapter", "whole", *_AUDIO, tiny="audio:qwen2_5_omni"),
    FamilyInfo(
        "qwen3_omni_moe",
        "qwen2_audio:Qwen3OmniAudioAdapter",
        "whole",
        "audio_feature_length (audio items)",
        "per clip of `L` mel frames (100 a second, no window): 13 per 100 frames + the rows of the rest; audio only",
        tiny="audio:qwen3_omni_moe",
    ),
    FamilyInfo("siglip", "fixed:SiglipAdapter", "vision_config", *_FIXED, tiny="towers:siglip"),
    FamilyInfo("siglip_vision_model", "fixed:SiglipAdapter", "whole", *_FIXED),
    FamilyInfo("clip", "fixed:ClipAdapter", "vision_config", *_CLS, tiny="towers:clip"),
    FamilyInfo("clip_vision_model", "fixed:ClipAdapter", "whole", *_CLS),
)

# Families ``mmencode make-tiny`` builds.
TINY_FAMILIES: tuple[str, ...] = tuple(sorted(info.model_type for info in CATALOG if info.tiny is not None))

# Families whose image processor transformers implements only with torchvision (models.optional).
TORCHVISION_MODEL_TYPES: tuple[str, ...] = tuple(info.model_type for info in CATALOG if info.torchvision_only)


def catalog_text() -> str:
    """One line per model_type, for ``mmencode serve --help``."""
    width = max(len(info.model_type) for info in CATALOG)
    lines = [f"  {info.model_type:<{width}}  metadata: {info.metadata}; rows: {info.rows}" for info in CATALOG]
    return "supported model_type values (config.json):\n" + "\n".join(line.replace("`", "") for line in lines)
