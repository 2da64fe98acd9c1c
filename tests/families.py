"""What transformers itself says about each family, for the family tests to compare the service against.

Per family: the rows the full ``...ForConditionalGeneration`` model splices into ``inputs_embeds`` for
each image (its own ``get_image_features``, plus whatever the model adds around them), the number of
placeholder tokens the family's own processor writes for each image (its ``replace_image_token`` and
friends, called on the real processor class), and a checkpoint whose processor disagrees with its model.

Several whole-processor classes cannot be instantiated without torchvision (they bundle a video
processor), so their counting methods are called on an instance built without ``__init__`` that holds
only the image processor and the token strings: the code that counts is still the processor's own.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    Gemma3ForConditionalGeneration,
    Gemma3Processor,
    Glm4vForConditionalGeneration,
    Glm4vProcessor,
    Idefics3ForConditionalGeneration,
    Idefics3Processor,
    InternVLForConditionalGeneration,
    InternVLProcessor,
    LlavaNextForConditionalGeneration,
    LlavaNextProcessor,
    LlavaOnevisionForConditionalGeneration,
    LlavaOnevisionProcessor,
    Mistral3ForConditionalGeneration,
    PreTrainedTokenizerFast,
    Qwen3_5ForConditionalGeneration,
    Qwen3VLForConditionalGeneration,
    Qwen3VLProcessor,
    SmolVLMForConditionalGeneration,
    SmolVLMProcessor,
)

from models import EncoderAdapter

__all__ = ["FAMILIES", "FamilySpec"]


def _bare(processor_class: type, **attributes: Any) -> Any:
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


def _edit_processor(src: Path, dst: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
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


# ----- Qwen3-VL -----
def _qwen3_vl_reference(directory: Path, images: list[Image.Image], adapter: EncoderAdapter) -> list[torch.Tensor]:
    inputs = adapter.processor(images=images, return_tensors="pt")
    model = Qwen3VLForConditionalGeneration.from_pretrained(directory).eval()
    with torch.inference_mode():
        out = model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"])
    # pooler_output: what is scattered at the <|image_pad|> tokens; deepstack_features: what the first
    # decoder layers add at the same positions, level by level.
    per_image = zip(out.pooler_output, *out.deepstack_features, strict=True)
    return [torch.cat([main, *levels], dim=-1) for main, *levels in per_image]


def _qwen3_vl_placeholders(adapter: EncoderAdapter, image: Image.Image) -> int:
    processor = _bare(Qwen3VLProcessor, image_processor=adapter.processor, image_token="<|image_pad|>")
    inputs = adapter.processor(images=[image], return_tensors="pt")
    return str(processor.replace_image_token(inputs, 0)).count("<|image_pad|>")


def _qwen3_5_reference(directory: Path, images: list[Image.Image], adapter: EncoderAdapter) -> list[torch.Tensor]:
    inputs = adapter.processor(images=images, return_tensors="pt")
    model = Qwen3_5ForConditionalGeneration.from_pretrained(directory).eval()
    with torch.inference_mode():
        return list(model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"]).pooler_output)


def _merge_size_four(whole: dict[str, Any]) -> None:
    # The processor groups 4x4 patches per placeholder; the tower still merges 2x2 (grids stay even).
    whole["image_processor"]["merge_size"] = 4


# ----- Gemma 3 -----
def _gemma3_reference(directory: Path, images: list[Image.Image], adapter: EncoderAdapter) -> list[torch.Tensor]:
    inputs = adapter.processor(images=images, return_tensors="pt")
    model = Gemma3ForConditionalGeneration.from_pretrained(directory).eval()
    with torch.inference_mode():
        views = model.model.get_image_features(inputs["pixel_values"]).pooler_output
    # One (mm_tokens_per_image, width) block per view; an image's views are the image then its crops.
    per_image = torch.split(views, [1 + int(n) for n in inputs["num_crops"]])
    return [chunk.reshape(-1, chunk.shape[-1]) for chunk in per_image]


_PAN_AND_SCAN = (
    "do_pan_and_scan",
    "pan_and_scan_min_crop_size",
    "pan_and_scan_max_num_crops",
    "pan_and_scan_min_ratio_to_activate",
)


def _gemma3_placeholders(adapter: EncoderAdapter, image: Image.Image) -> int:
    tokenizer = tiny_tokenizer(
        image_token="<image_soft_token>", boi_token="<start_of_image>", eoi_token="<end_of_image>"
    )
    seq = adapter.processor_config.setting("image_seq_length")
    processor = Gemma3Processor(image_processor=adapter.processor, tokenizer=tokenizer, image_seq_length=seq)
    # Gemma3Processor applies its own pan-and-scan defaults (off) unless the call asks, as vLLM's
    # mm_processor_kwargs do: ask for the checkpoint's settings.
    settings = {name: getattr(adapter.processor, name) for name in _PAN_AND_SCAN}
    ids = processor(text=["a <start_of_image>"], images=[[image]], return_tensors="pt", **settings)["input_ids"]
    return int((ids == tokenizer.convert_tokens_to_ids("<image_soft_token>")).sum())


def _image_seq_length(length: int) -> Callable[[dict[str, Any]], None]:
    def edit(whole: dict[str, Any]) -> None:
        whole["image_seq_length"] = length

    return edit


# ----- GLM-4.1V -----
def _glm4v_reference(directory: Path, images: list[Image.Image], adapter: EncoderAdapter) -> list[torch.Tensor]:
    inputs = adapter.processor(images=images, return_tensors="pt")
    model = Glm4vForConditionalGeneration.from_pretrained(directory).eval()
    with torch.inference_mode():
        return list(model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"]).pooler_output)


def _glm4v_placeholders(adapter: EncoderAdapter, image: Image.Image) -> int:
    processor = _bare(Glm4vProcessor, image_processor=adapter.processor, image_token="<|image|>")
    inputs = adapter.processor(images=[image], return_tensors="pt")
    return str(processor.replace_image_token(inputs, 0)).count("<|image|>")


# ----- Idefics3 / SmolVLM -----
def _idefics3_reference(directory: Path, images: list[Image.Image], adapter: EncoderAdapter) -> list[torch.Tensor]:
    # All three images in one processor call, padded to the same view count as transformers batches them.
    inputs = adapter.processor(images=[[image] for image in images], return_tensors="pt")
    model_class: Any = (
        SmolVLMForConditionalGeneration if adapter.family == "smolvlm" else Idefics3ForConditionalGeneration
    )
    model = model_class.from_pretrained(directory).eval()
    with torch.inference_mode():
        out = model.model.get_image_features(inputs["pixel_values"], inputs["pixel_attention_mask"])
    return list(out.pooler_output)


_IDEFICS3_TOKENS = {
    "image_token": "<image>",
    "fake_image_token": "<fake_token_around_image>",
    "global_image_token": "<global-img>",
    "end_of_utterance_token": "<end_of_utterance>",
}


def _idefics3_placeholders(adapter: EncoderAdapter, image: Image.Image) -> int:
    seq = adapter.processor_config.setting("image_seq_len")
    inputs = adapter.processor(images=[[image]], return_tensors="pt", return_row_col_info=True)
    if adapter.family == "idefics3":
        # The real processor, with a tokenizer: count the <image> ids it writes.
        tokenizer = tiny_tokenizer(**_IDEFICS3_TOKENS)
        processor = Idefics3Processor(image_processor=adapter.processor, tokenizer=tokenizer, image_seq_len=seq)
        ids = processor(text=["a <image>"], images=[[image]], return_tensors="pt")["input_ids"]
        return int((ids == tokenizer.convert_tokens_to_ids("<image>")).sum())
    # SmolVLMProcessor bundles a video processor (torchvision): its own prompt builder, on a bare instance.
    processor = _bare(
        SmolVLMProcessor,
        image_processor=adapter.processor,
        image_seq_len=seq,
        image_token="<image>",
        fake_image_token="<fake_token_around_image>",
        global_image_token="<global-img>",
    )
    return str(processor.replace_image_token(inputs, 0)).count("<image>")


def _image_seq_len(length: int) -> Callable[[dict[str, Any]], None]:
    def edit(whole: dict[str, Any]) -> None:
        whole["image_seq_len"] = length

    return edit


# ----- Mistral 3 -----
def _mistral3_reference(directory: Path, images: list[Image.Image], adapter: EncoderAdapter) -> list[torch.Tensor]:
    inputs = adapter.processor(images=images, return_tensors="pt")  # padded to the largest, with image_sizes
    model = Mistral3ForConditionalGeneration.from_pretrained(directory).eval()
    with torch.inference_mode():
        return list(model.model.get_image_features(inputs["pixel_values"], inputs["image_sizes"]).pooler_output)


def _mistral3_placeholders(adapter: EncoderAdapter, image: Image.Image) -> int:
    # transformers' PixtralProcessor module does not import without torchvision. Its
    # replace_image_token (models/pixtral/processing_pixtral.py, 5.24), line for line: one [IMG] per
    # merged patch, an [IMG_BREAK] closing each row, the last one turned into [IMG_END].
    settings = adapter.processor_config.processor
    patch_size = settings["patch_size"] * settings["spatial_merge_size"]
    height, width = adapter.processor(images=[image], return_tensors="pt")["image_sizes"][0].tolist()
    num_height_tokens, num_width_tokens = height // patch_size, width // patch_size
    replace_tokens = [["[IMG]"] * num_width_tokens + ["[IMG_BREAK]"]] * num_height_tokens
    replace_tokens = [item for sublist in replace_tokens for item in sublist]
    replace_tokens[-1] = "[IMG_END]"
    return replace_tokens.count("[IMG]")


def _spatial_merge_size_one(whole: dict[str, Any]) -> None:
    whole["spatial_merge_size"] = 1


# ----- LLaVA-OneVision -----
def _llava_onevision_reference(
    directory: Path, images: list[Image.Image], adapter: EncoderAdapter
) -> list[torch.Tensor]:
    inputs = adapter.processor(images=images, return_tensors="pt")  # tiles padded to the largest count
    model = LlavaOnevisionForConditionalGeneration.from_pretrained(directory).eval()
    config = model.config
    with torch.inference_mode():
        packed = model.model.get_image_features(
            inputs["pixel_values"],
            inputs["image_sizes"],
            vision_feature_layer=config.vision_feature_layer,
            vision_feature_select_strategy=config.vision_feature_select_strategy,
            vision_aspect_ratio=config.vision_aspect_ratio,
            batch_num_images=inputs["batch_num_images"],
        ).pooler_output
    return list(packed)  # one tensor per image: base tile, unpadded map, newlines


def _llava_onevision_placeholders(adapter: EncoderAdapter, image: Image.Image) -> int:
    settings = adapter.processor_config.processor
    processor = _bare(
        LlavaOnevisionProcessor,
        image_processor=adapter.processor,
        image_token="<image>",
        num_image_tokens=settings["num_image_tokens"],
        vision_feature_select_strategy=settings["vision_feature_select_strategy"],
        vision_aspect_ratio=settings["vision_aspect_ratio"],
    )
    inputs = adapter.processor(images=[image], return_tensors="pt")
    return str(processor.replace_image_token(inputs, 0)).count("<image>")


# ----- LLaVA-NeXT -----
def _llava_next_reference(directory: Path, images: list[Image.Image], adapter: EncoderAdapter) -> list[torch.Tensor]:
    inputs = adapter.processor(images=images, return_tensors="pt")
    model = LlavaNextForConditionalGeneration.from_pretrained(directory).eval()
    config = model.config
    with torch.inference_mode():
        packed = model.model.get_image_features(
            inputs["pixel_values"],
            inputs["image_sizes"],
            vision_feature_layer=config.vision_feature_layer,
            vision_feature_select_strategy=config.vision_feature_select_strategy,
        ).pooler_output
    return list(packed)


def _llava_next_placeholders(adapter: EncoderAdapter, image: Image.Image) -> int:
    settings = adapter.processor_config.processor
    processor = _bare(
        LlavaNextProcessor,
        image_processor=adapter.processor,
        image_token="<image>",
        patch_size=settings["patch_size"],
        num_additional_image_tokens=settings["num_additional_image_tokens"],
        vision_feature_select_strategy=settings["vision_feature_select_strategy"],
    )
    inputs = adapter.processor(images=[image], return_tensors="pt")
    return str(processor.replace_image_token(inputs, 0)).count("<image>")


def _patch_size_four(whole: dict[str, Any]) -> None:
    # The processor counts 4-pixel patches; the tower's are 8.
    whole["patch_size"] = 4


def _num_image_tokens(whole: dict[str, Any]) -> None:
    # The processor believes in 5x5 patches per tile; the tower makes 4x4.
    whole["num_image_tokens"] = 25


# ----- InternVL, OpenGVLab layout -----
# OpenGVLab -> transformers tensor names: the renames of transformers' own conversion
# (conversion_mapping.py, written independently of models/internvl.py's mapping the other way).
_TO_TRANSFORMERS = [
    (r"^vision_model\.", "model.vision_tower."),
    (r"\.encoder\.layers\.(\d+)\.", r".encoder.layer.\1."),
    (r"\.ls1$", ".lambda_1"),
    (r"\.ls2$", ".lambda_2"),
    (r"\.attn\.proj\.", ".attention.projection_layer."),
    (r"\.norm1\.", ".layernorm_before."),
    (r"\.norm2\.", ".layernorm_after."),
    (r"\.embeddings\.class_embedding$", ".embeddings.cls_token"),
    (r"\.embeddings\.position_embedding$", ".embeddings.position_embeddings"),
    (r"\.embeddings\.patch_embedding\.", ".embeddings.patch_embeddings.projection."),
    (r"^language_model\.model\.", "model.language_model."),
    (r"^language_model\.lm_head\.", "lm_head."),
    (r"^mlp1\.0\.", "model.multi_modal_projector.layer_norm."),
    (r"^mlp1\.1\.", "model.multi_modal_projector.linear_1."),
    (r"^mlp1\.3\.", "model.multi_modal_projector.linear_2."),
]


def opengvlab_to_transformers(src: Path, dst: Path) -> Path:
    """A transformers-layout InternVL checkpoint (config, weights, processor) from an OpenGVLab one."""
    dst.mkdir(parents=True)
    converted: dict[str, torch.Tensor] = {}
    for key, tensor in load_file(str(src / "model.safetensors")).items():
        for pattern, replacement in _TO_TRANSFORMERS:
            key = re.sub(pattern, replacement, key)
        if ".attn.qkv." in key:
            for part, chunk in zip("qkv", tensor.chunk(3), strict=True):
                converted[key.replace(".attn.qkv.", f".attention.{part}_proj.")] = chunk
        else:
            converted[key] = tensor
    save_file(converted, str(dst / "model.safetensors"), metadata={"format": "pt"})
    chat = json.loads((src / "config.json").read_text())
    vision = chat["vision_config"]
    config = {
        "model_type": "internvl",
        "architectures": ["InternVLForConditionalGeneration"],
        "downsample_ratio": chat["downsample_ratio"],
        "vision_feature_layer": chat["select_layer"],
        "vision_feature_select_strategy": "default",
        "vision_config": {
            "model_type": "internvl_vision",
            "hidden_size": vision["hidden_size"],
            "intermediate_size": vision["intermediate_size"],
            "num_hidden_layers": vision["num_hidden_layers"],
            "num_attention_heads": vision["num_attention_heads"],
            "image_size": [chat["force_image_size"]] * 2,
            "patch_size": [vision["patch_size"]] * 2,
            "attention_bias": vision["qkv_bias"],
            "use_qk_norm": vision["qk_normalization"],
            "norm_type": vision["norm_type"],
            "layer_norm_eps": vision["layer_norm_eps"],
        },
        "text_config": {**chat["llm_config"], "model_type": "qwen2"},
    }
    (dst / "config.json").write_text(json.dumps(config))
    side = chat["force_image_size"]
    processor = {
        "image_processor_type": "GotOcr2ImageProcessor",
        "size": {"height": side, "width": side},
        "crop_to_patches": True,
        "min_patches": chat["min_dynamic_patch"],
        "max_patches": chat["max_dynamic_patch"],
        "image_mean": [0.485, 0.456, 0.406],
        "image_std": [0.229, 0.224, 0.225],
        "resample": 3,
    }
    (dst / "preprocessor_config.json").write_text(json.dumps(processor))
    return dst


def _internvl_chat_reference(directory: Path, images: list[Image.Image], adapter: EncoderAdapter) -> list[torch.Tensor]:
    twin = opengvlab_to_transformers(directory, directory.parent / f"{directory.name}-as-transformers")
    try:
        inputs = adapter.processor(images=images, crop_to_patches=True, return_tensors="pt")
        model = InternVLForConditionalGeneration.from_pretrained(twin).eval()
        with torch.inference_mode():
            tiles = model.model.get_image_features(pixel_values=inputs["pixel_values"]).pooler_output
    finally:
        shutil.rmtree(twin)
    return [chunk.reshape(-1, chunk.shape[-1]) for chunk in torch.split(tiles, inputs["num_patches"].tolist())]


def _internvl_chat_placeholders(adapter: EncoderAdapter, image: Image.Image) -> int:
    # OpenGVLab's chat code: num_image_token = (image_size // patch_size) ** 2 * downsample_ratio ** 2
    # <IMG_CONTEXT> per tile; transformers' InternVLProcessor writes the same run per tile.
    chat = json.loads((adapter.checkpoint / "config.json").read_text())
    per_tile = int(
        (chat["force_image_size"] // chat["vision_config"]["patch_size"]) ** 2 * chat["downsample_ratio"] ** 2
    )
    processor = _bare(
        InternVLProcessor,
        image_seq_length=per_tile,
        image_token="<IMG_CONTEXT>",
        start_image_token="<img>",
        end_image_token="</img>",
    )
    inputs = adapter.processor(images=[image], crop_to_patches=True, return_tensors="pt")
    return str(processor.replace_image_token(inputs, 0)).count("<IMG_CONTEXT>")


FAMILIES: dict[str, FamilySpec] = {
    "qwen3_vl": FamilySpec(
        "qwen3_vl",
        ("image_grid_thw",),
        _qwen3_vl_reference,
        _qwen3_vl_placeholders,
        lambda src, dst: _edit_processor(src, dst, _merge_size_four),
    ),
    "qwen3_5": FamilySpec(
        "qwen3_5",
        ("image_grid_thw",),
        _qwen3_5_reference,
        _qwen3_vl_placeholders,  # Qwen3.5 repos name Qwen3VLProcessor
        lambda src, dst: _edit_processor(src, dst, _merge_size_four),
    ),
    "gemma3": FamilySpec(
        "gemma3",
        ("num_crops",),
        _gemma3_reference,
        _gemma3_placeholders,
        # The processor writes 9 soft tokens per view; the model pools to 16.
        lambda src, dst: _edit_processor(src, dst, _image_seq_length(9)),
    ),
    "glm4v": FamilySpec(
        "glm4v",
        ("image_grid_thw",),
        _glm4v_reference,
        _glm4v_placeholders,
        lambda src, dst: _edit_processor(src, dst, _merge_size_four),
    ),
    **{
        family: FamilySpec(
            family,
            ("crop_grid",),
            _idefics3_reference,
            _idefics3_placeholders,
            # The processor writes 9 <image> tokens per view; the connector yields 16.
            lambda src, dst: _edit_processor(src, dst, _image_seq_len(9)),
        )
        for family in ("idefics3", "smolvlm")
    },
    "mistral3": FamilySpec(
        "mistral3",
        ("image_sizes",),
        _mistral3_reference,
        _mistral3_placeholders,
        # The processor counts one [IMG] per patch; the projector merges 2x2.
        lambda src, dst: _edit_processor(src, dst, _spatial_merge_size_one),
    ),
    "llava_onevision": FamilySpec(
        "llava_onevision",
        ("image_sizes",),
        _llava_onevision_reference,
        _llava_onevision_placeholders,
        lambda src, dst: _edit_processor(src, dst, _num_image_tokens),
    ),
    "llava_next": FamilySpec(
        "llava_next",
        ("image_sizes",),
        _llava_next_reference,
        _llava_next_placeholders,
        lambda src, dst: _edit_processor(src, dst, _patch_size_four),
    ),
    "internvl_chat": FamilySpec(
        "internvl_chat", ("num_patches",), _internvl_chat_reference, _internvl_chat_placeholders, None
    ),
}
