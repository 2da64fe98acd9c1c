"""Tiny audio checkpoints: Qwen2-Audio, Qwen2.5-Omni and Qwen3-Omni (of the Omni models, mmencode reads the
thinker's audio tower).

Both keep Whisper's window (``max_source_positions`` 1500: 3000 mel frames, 30 s), which their towers
require of every input; the rest is as small as the architectures allow. The Omni models are built without
their speech output (``enable_audio_output`` off): speech is the language side's business. With
``audio_output=True`` they come as released, ``enable_audio_output`` on, with a (tiny) talker and
Qwen2.5-Omni's ``token2wav`` or Qwen3-Omni's ``code2wav`` weights beside the thinker's, which mmencode must
leave unread; the thinker's weights are the same either way (seeded by name).
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


# The speech side, as small as the architectures allow: the talker (a one-layer decoder reading the
# thinker's hidden states) and the codes-to-waveform model.
_SPEECH_DECODER: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "max_position_embeddings": 2048,
}
_QWEN2_5_OMNI_SPEECH: dict[str, Any] = {
    "talker_config": {
        **_SPEECH_DECODER,
        **_OMNI_TOKEN_IDS,
        "vocab_size": 32,
        "embedding_size": TEXT_CONFIG["hidden_size"],
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]},
        "tts_text_start_token_id": 20,
        "tts_text_end_token_id": 21,
        "tts_text_pad_token_id": 22,
        "tts_codec_start_token_id": 28,
        "tts_codec_end_token_id": 29,
        "tts_codec_pad_token_id": 30,
        "tts_codec_mask_token_id": 31,
        "audio_token_index": 3,
        "image_token_index": 10,
        "video_token_index": 11,
    },
    "token2wav_config": {
        "dit_config": {
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "head_dim": 16,
            "emb_dim": 16,
            "look_ahead_layers": [1],
            "look_backward_layers": [0],
            "num_embeds": 32,
            "mel_dim": 8,
            "enc_emb_dim": 8,
            "enc_dim": 8,
            "enc_channels": [16, 16, 16, 16, 48],
            "enc_attention_channels": 8,
            "enc_se_channels": 8,
        },
        # Each upsampling halves the channels: two steps from 64.
        "bigvgan_config": {
            "mel_dim": 8,
            "upsample_initial_channel": 64,
            "resblock_kernel_sizes": [3],
            "resblock_dilation_sizes": [[1, 3, 5]],
            "upsample_rates": [2, 2],
            "upsample_kernel_sizes": [4, 4],
        },
    },
}
_QWEN3_OMNI_SPEECH: dict[str, Any] = {
    "talker_config": {
        "code_predictor_config": {**_SPEECH_DECODER, "vocab_size": 32, "num_code_groups": 4},
        "text_config": {
            **_SPEECH_DECODER,
            "vocab_size": 64,
            "moe_intermediate_size": 16,
            "shared_expert_intermediate_size": 32,
            "num_experts": 2,
            "num_experts_per_tok": 1,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1e6,
                "mrope_section": [2, 3, 3],
                "mrope_interleaved": True,
            },
        },
        "num_code_groups": 4,
        "thinker_hidden_size": TEXT_CONFIG["hidden_size"],
        "accept_hidden_layer": 1,
        # Read by the talker's constructor, with no default in its config class: the released
        # config.json names it (as it names shared_expert_intermediate_size above).
        "spatial_merge_size": 2,
        "codec_eos_token_id": 50,
        "codec_nothink_id": 51,
        "codec_think_bos_id": 52,
        "codec_think_eos_id": 53,
        "codec_pad_id": 54,
        "codec_bos_id": 55,
        "audio_token_id": 3,
        "image_token_id": 10,
        "video_token_id": 11,
        "vision_start_token_id": 12,
        "audio_start_token_id": 4,
    },
    "code2wav_config": {
        **_SPEECH_DECODER,
        "num_key_value_heads": 2,
        "codebook_size": 32,
        "num_quantizers": 4,
        "sliding_window": 8,
        "upsample_rates": [2, 2],
        "upsampling_ratios": [2],
        "decoder_dim": 32,
    },
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


def qwen2_5_omni(
    layout: Layout, processor_merge_size: int, *, audio_output: bool = False
) -> tuple[PreTrainedModel, TinyProcessor]:
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
    speech = _QWEN2_5_OMNI_SPEECH if audio_output else {}
    config = Qwen2_5OmniConfig(enable_audio_output=audio_output, thinker_config=thinker, **speech)
    return Qwen2_5OmniForConditionalGeneration(config), _feature_extractor("Qwen2_5OmniProcessor")


def qwen3_omni_moe(
    layout: Layout, processor_merge_size: int, *, audio_output: bool = False
) -> tuple[PreTrainedModel, TinyProcessor]:
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
    speech = _QWEN3_OMNI_SPEECH if audio_output else {}
    config = Qwen3OmniMoeConfig(enable_audio_output=audio_output, thinker_config=thinker, **speech)
    return Qwen3OmniMoeForConditionalGeneration(config), _feature_extractor("Qwen3OmniMoeProcessor")
