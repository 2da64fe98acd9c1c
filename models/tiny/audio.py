"""Tiny audio checkpoints: Qwen2-Audio, Qwen2.5-Omni and Qwen3-Omni (of the Omni models, mmencode reads the
thinker's audio tower).

Both keep Whisper's window (``max_source_positions`` 1500: 3000 mel frames, 30 s), which their towers
require of every input; the rest is as small as the architectures allow. Qwen2.5-Omni is built without
its talker (``enable_audio_output`` off): speech output is the language side's business.
"""

from __future__ import annotations

from typing import Any

from transformers import (
    PreTrainedModel,
    Qwen2_5OmniConfig,
    Qwen2_5OmniForConditionalGeneration,
    Qwen2AudioConfig,
    Qwen2AudioForConditionalGeneration,
    Qwen3OmniMoeConfig,
    Qwen3OmniMoeForConditionalGeneration,
    WhisperFeatureExtractor,
)

from mmencode.models.tiny.common import TEXT_CONFIG, Layout, TinyProcessor

# Whisper large-v3's mel bins, as both families' feature extractors use.
_MEL_BINS = 128
_AUDIO_ENCODER: dict[str, Any] = {
    "num_mel_bins": _MEL_BINS,
    "encoder_layers": 2,
    "encoder_attention_heads": 2,
    "encoder_ffn_dim": 64,
    "d_model": 32,
}


# What the two Omni thinkers share: a one-block vision tower (never read here) and the ids of the tokens
# around a clip or an image; each names its audio, image and video tokens its own way.
_OMNI_VISION: dict[str, Any] = {
    "depth": 1,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "out_hidden_size": TEXT_CONFIG["hidden_size"],
}
_OMNI_TOKEN_IDS: dict[str, int] = {
    "audio_start_token_id": 4,
    "audio_end_token_id": 5,
    "vision_start_token_id": 12,
    "vision_end_token_id": 13,
}


def _feature_extractor(processor_class: str) -> TinyProcessor:
    return TinyProcessor(
        WhisperFeatureExtractor(feature_size=_MEL_BINS),
        processor_class,
        default_layout="nested",
        component="feature_extractor",
    )


def qwen2_audio(layout: Layout, processor_merge_size: int) -> tuple[PreTrainedModel, TinyProcessor]:
    if layout != "full":
        raise ValueError("tiny Qwen2-Audio checkpoints come as full models")
    config = Qwen2AudioConfig(
        audio_config=_AUDIO_ENCODER,
        text_config={**TEXT_CONFIG, "model_type": "qwen2", "max_position_embeddings": 2048},
        audio_token_index=3,
    )
    return Qwen2AudioForConditionalGeneration(config), _feature_extractor("Qwen2AudioProcessor")


def qwen2_5_omni(layout: Layout, processor_merge_size: int) -> tuple[PreTrainedModel, TinyProcessor]:
    if layout != "full":
        raise ValueError("tiny Qwen2.5-Omni checkpoints come as full models")
    text = {
        **TEXT_CONFIG,
        "max_position_embeddings": 2048,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 6, 6]},
    }
    thinker = {
        # n_window: the tower attends within windows of 2*n_window mel frames, as the released one does (100).
        "audio_config": {**_AUDIO_ENCODER, "output_dim": text["hidden_size"], "n_window": 100},
        "vision_config": {**_OMNI_VISION, "fullatt_block_indexes": [0]},
        "text_config": text,
        **_OMNI_TOKEN_IDS,
        "audio_token_index": 3,
        "image_token_index": 10,
        "video_token_index": 11,
    }
    config = Qwen2_5OmniConfig(enable_audio_output=False, thinker_config=thinker)
    return Qwen2_5OmniForConditionalGeneration(config), _feature_extractor("Qwen2_5OmniProcessor")


def qwen3_omni_moe(layout: Layout, processor_merge_size: int) -> tuple[PreTrainedModel, TinyProcessor]:
    if layout != "full":
        raise ValueError("tiny Qwen3-Omni checkpoints come as full models")
    text = {
        **TEXT_CONFIG,
        "max_position_embeddings": 2048,
        "moe_intermediate_size": 32,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "head_dim": 32,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1e6,
            "mrope_section": [4, 6, 6],
            "mrope_interleaved": True,
        },
    }
    thinker = {
        # n_window 50: chunks of 100 mel frames (13 rows each), the released tower's.
        "audio_config": {
            **_AUDIO_ENCODER,
            "output_dim": text["hidden_size"],
            "n_window": 50,
            "downsample_hidden_size": 16,
        },
        "vision_config": {**_OMNI_VISION, "deepstack_visual_indexes": []},
        "text_config": text,
        **_OMNI_TOKEN_IDS,
        "audio_token_id": 3,
        "image_token_id": 10,
        "video_token_id": 11,
    }
    config = Qwen3OmniMoeConfig(enable_audio_output=False, thinker_config=thinker)
    return Qwen3OmniMoeForConditionalGeneration(config), _feature_extractor("Qwen3OmniMoeProcessor")
