"""Audio towers: Qwen2-Audio, and the audio towers of Qwen2.5-Omni's and Qwen3-Omni's thinkers.

Both take Whisper log-mel features: the checkpoint's ``WhisperFeatureExtractor`` pads (or cuts) every clip
to its 30 s window, 3000 frames, and the mask's sum is the clip's own length ``L`` in frames. Two
stride-2 steps make the rows: ``((L - 1) // 2 + 1 - 2) // 2 + 1`` per clip (750 for a full window), the
placeholder count both families' processors insert. Clips are never cut here: the scheduler refuses one
longer than the window (``max_audio_seconds``), where transformers would drop the rest without a word.

Qwen2-Audio runs the whole padded window with the padding masked out of attention, then its projector,
and keeps each clip's first rows; Qwen2.5-Omni's tower packs the clips' own frames (no padding) and
attends within windows of ``2 * n_window`` frames. Each reproduces what its transformers model scatters
at the audio placeholders.

Qwen3-Omni has no window: its processor pads a batch to its longest clip (``padding=True``, nothing cut),
its tower works in chunks of ``2 * n_window`` frames, and a clip of ``L`` frames makes 13 rows per whole
chunk plus the rows of the rest (``_get_feat_extract_output_lengths`` of its processor). A clip is
preprocessed alone, as the processor would take it by itself: its frame count is ``samples // 160``
(Whisper drops the last STFT frame), where in a padded batch the same clip would count one more.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from PIL import Image
from transformers import WhisperFeatureExtractor
from transformers.masking_utils import create_bidirectional_mask
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniAudioEncoder
from transformers.models.qwen2_audio.modeling_qwen2_audio import Qwen2AudioEncoder, Qwen2AudioMultiModalProjector
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeAudioEncoder
from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import (
    _get_feat_extract_output_lengths as qwen3_omni_rows_of_frames,
)

from mmencode.models.base import DecodedAudio, EncoderAdapter, EncoderOutput, PreparedItem
from mmencode.models.errors import MetadataError, UnsupportedModalityError
from mmencode.models.processor_backend import Backend
from mmencode.models.processor_config import ProcessorConfig, read_processor_config


def rows_of_frames(frames: torch.Tensor) -> torch.Tensor:
    """Rows the towers make of clips of ``frames`` mel frames (both families' processors count so)."""
    after_conv = (frames - 1) // 2 + 1
    return (after_conv - 2) // 2 + 1


class Qwen2AudioTower(torch.nn.Module):
    """Qwen2-Audio's encoder and projector, under the names the checkpoint gives them."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.audio_tower = Qwen2AudioEncoder._from_config(config.audio_config)
        self.multi_modal_projector = Qwen2AudioMultiModalProjector(config)


class Qwen2_5OmniAudioTower(torch.nn.Module):
    """Qwen2.5-Omni's thinker's audio encoder (its projection inside), under the checkpoint's names."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.audio_tower = Qwen2_5OmniAudioEncoder._from_config(config.thinker_config.audio_config)


class Qwen3OmniAudioTower(torch.nn.Module):
    """Qwen3-Omni's thinker's audio encoder, under the checkpoint's names."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.audio_tower = Qwen3OmniMoeAudioEncoder._from_config(config.thinker_config.audio_config)


class _AudioAdapter(EncoderAdapter):
    """What the audio families share: Whisper features in, rows per clip out; no images."""

    takes_images: ClassVar[bool] = False
    required_audio_metadata: ClassVar[tuple[str, ...]] = ("audio_feature_length",)
    processor_class: ClassVar[type] = WhisperFeatureExtractor
    float_inputs: ClassVar[tuple[str, ...]] = ("input_features",)

    @classmethod
    def load_processor_config(cls, checkpoint: Path, config: Any) -> ProcessorConfig:
        return read_processor_config(checkpoint, component="feature_extractor")

    @classmethod
    def build_processor(cls, config: ProcessorConfig, backend: Backend) -> Any:
        # One implementation (numpy); the image processor backend does not apply.
        return WhisperFeatureExtractor.from_dict(config.image_processor)

    @property
    def audio_sampling_rate(self) -> int:
        return int(self.processor.sampling_rate)

    @property
    def max_audio_seconds(self) -> float | None:
        return float(self.processor.n_samples) / self.audio_sampling_rate if self.windowed else None

    @property
    def max_frames(self) -> int:
        return int(self.processor.nb_max_frames)

    def preprocess(self, image: Image.Image) -> PreparedItem:
        raise UnsupportedModalityError(f"{self.family} models take audio only")

    def tokens_from_metadata(self, metadata: Mapping[str, Any]) -> int:
        raise UnsupportedModalityError(f"{self.family} models take audio only")

    # How the family's processor calls its feature extractor: the whole window, padded (Qwen2-Audio,
    # Qwen2.5-Omni), or the clip's own length, nothing cut (Qwen3-Omni).
    windowed: ClassVar[bool] = True

    def rows_of(self, frames: torch.Tensor) -> torch.Tensor:
        """Rows of clips of ``frames`` mel frames, as the family's processor counts its placeholders."""
        return rows_of_frames(frames)

    def preprocess_audio(self, audio: DecodedAudio) -> PreparedItem:
        padding: dict[str, Any] = {"padding": "max_length"} if self.windowed else {"padding": True, "truncation": False}
        out = self.processor(
            [audio.samples],
            sampling_rate=audio.sampling_rate,
            return_attention_mask=True,
            return_tensors="pt",
            **padding,
        )
        mask = out["attention_mask"]
        frames = int(mask.sum())
        return PreparedItem(
            tensors={"input_features": out["input_features"], "feature_attention_mask": mask},
            metadata={"audio_feature_length": frames},
            num_tokens=int(self.rows_of(torch.tensor(frames))),
        )

    def audio_tokens_from_metadata(self, metadata: Mapping[str, Any]) -> int:
        frames = self._int_field(metadata, "audio_feature_length")
        if self.windowed and frames > self.max_frames:
            raise MetadataError(
                "audio_feature_length",
                f"must be at most {self.max_frames} (the feature extractor's window), got {frames}",
                missing=False,
            )
        return int(self.rows_of(torch.tensor(frames)))

    def warmup_item(self) -> PreparedItem:
        # One second of a quiet tone: every clip costs a whole window, so its length does not matter.
        rate = self.audio_sampling_rate
        tone = 0.1 * np.sin(2 * np.pi * 440 * np.arange(rate) / rate).astype(np.float32)
        return self.preprocess_audio(DecodedAudio(samples=tone, sampling_rate=rate))


class Qwen2AudioAdapter(_AudioAdapter):
    family = "qwen2_audio"
    tower_class: ClassVar[type[torch.nn.Module]] = Qwen2AudioTower
    # transformers 5 saves the hub's layout (``audio_tower.``); a layout under ``model.`` loads too.
    weight_prefixes: ClassVar[tuple[str, ...]] = ("", "model.")

    @property
    def hidden_size(self) -> int:
        return int(self.config.text_config.hidden_size)

    def _forward(self, batch: dict[str, torch.Tensor], items: Sequence[PreparedItem]) -> EncoderOutput:
        # Qwen2AudioModel.forward's audio path: the window's padding masked out of attention, then the
        # projector, then each clip's own rows.
        features, frames = batch["input_features"], batch["feature_attention_mask"].sum(-1)
        after_conv = (frames - 1) // 2 + 1
        rows = rows_of_frames(frames)
        length = (features.shape[-1] - 2) // 2 + 1
        attended = (torch.arange(length, device=features.device)[None, :] < after_conv[:, None]).long()
        tower = self.module
        assert isinstance(tower, Qwen2AudioTower)
        mask = create_bidirectional_mask(
            config=tower.audio_tower.config,
            inputs_embeds=torch.zeros(features.shape[0], length, 1, dtype=features.dtype, device=features.device),
            attention_mask=attended,
        )
        hidden = tower.audio_tower(features, attention_mask=mask).last_hidden_state
        projected = tower.multi_modal_projector(hidden)
        counts = [int(n) for n in rows]
        return EncoderOutput(
            rows=torch.cat([projected[i, :n] for i, n in enumerate(counts)]),
            rows_per_item=counts,
        )


class Qwen2_5OmniAudioAdapter(_AudioAdapter):
    family = "qwen2_5_omni"
    tower_class: ClassVar[type[torch.nn.Module]] = Qwen2_5OmniAudioTower
    # The thinker's tower in a full Qwen2_5OmniForConditionalGeneration save; nothing else is read.
    weight_prefixes: ClassVar[tuple[str, ...]] = ("thinker.",)

    @property
    def hidden_size(self) -> int:
        return int(self.config.thinker_config.audio_config.output_dim)

    def _forward(self, batch: dict[str, torch.Tensor], items: Sequence[PreparedItem]) -> EncoderOutput:
        # Qwen2_5OmniThinkerForConditionalGeneration.get_audio_features: each clip's own frames, packed.
        mask = batch["feature_attention_mask"]
        frames = mask.sum(-1)
        features = batch["input_features"].permute(0, 2, 1)[mask.bool()].permute(1, 0)
        rows = rows_of_frames(frames)
        tower = self.module
        assert isinstance(tower, Qwen2_5OmniAudioTower)
        out = tower.audio_tower(features, feature_lens=frames, aftercnn_lens=(frames - 1) // 2 + 1)
        return EncoderOutput(rows=out.last_hidden_state, rows_per_item=[int(n) for n in rows])


class Qwen3OmniAudioAdapter(_AudioAdapter):
    family = "qwen3_omni_moe"
    tower_class: ClassVar[type[torch.nn.Module]] = Qwen3OmniAudioTower
    weight_prefixes: ClassVar[tuple[str, ...]] = ("thinker.",)
    windowed: ClassVar[bool] = False

    @property
    def hidden_size(self) -> int:
        return int(self.config.thinker_config.audio_config.output_dim)

    def rows_of(self, frames: torch.Tensor) -> torch.Tensor:
        result: torch.Tensor = qwen3_omni_rows_of_frames(frames, int(self.config.thinker_config.audio_config.n_window))
        return result

    def collate(self, items: Sequence[PreparedItem]) -> dict[str, torch.Tensor]:
        # Clips keep their own lengths: pad to the longest, as the processor pads a batch (the mask says
        # which frames are a clip's; the tower reads only those).
        longest = max(item.tensors["input_features"].shape[-1] for item in items)
        return {
            name: torch.cat(
                [
                    torch.nn.functional.pad(item.tensors[name], (0, longest - item.tensors[name].shape[-1]))
                    for item in items
                ]
            )
            for name in ("input_features", "feature_attention_mask")
        }

    def _forward(self, batch: dict[str, torch.Tensor], items: Sequence[PreparedItem]) -> EncoderOutput:
        # Qwen3OmniMoeThinkerForConditionalGeneration.get_audio_features: each clip's own frames, packed.
        mask = batch["feature_attention_mask"]
        frames = mask.sum(-1)
        features = batch["input_features"].permute(0, 2, 1)[mask.bool()].permute(1, 0)
        tower = self.module
        assert isinstance(tower, Qwen3OmniAudioTower)
        out = tower.audio_tower(features, feature_lens=frames)
        return EncoderOutput(rows=out.last_hidden_state, rows_per_item=[int(n) for n in self.rows_of(frames)])
