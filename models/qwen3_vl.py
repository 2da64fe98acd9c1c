"""Qwen3-VL: dynamic resolution as Qwen2-VL, plus DeepStack feature levels.

The tower returns the merged rows the language model splices in at its ``<|image_pad|>`` tokens, and
one more merged feature map per DeepStack level, which the language model adds to its hidden states in
its first layers at the same positions. mmencode returns them side by side along the width,
``[main | level_0 | level_1 | ...]``: the layout vLLM and SGLang use for Qwen3-VL encoder output and
``image_embeds`` input. Row counts are Qwen2-VL's (``t*h*w / merge_size**2``); the width is
``out_hidden_size * (1 + levels)``, and every item's metadata names the split (``deepstack_split``).
The image processor is Qwen2-VL's, on the backend ``--image-processor-backend`` chooses. A pooled
vector (``/v1/embeddings``) averages the main embedding only.

Qwen3.5 (``qwen3_5``) keeps the same vision tower without DeepStack: its rows are the merged rows alone.

Videos (both families): ``Qwen3VLVideoProcessor`` samples the clip (2 frames per second by default, at
least ``min_frames``, indices ``linspace(...).round()``), and the tower encodes the clip's patches as it
does an image's. The language side writes ``<t seconds>`` before each temporal patch's placeholders, so
every video item carries ``timestamps``: one per temporal patch, the mean time of its frames, as
``Qwen3VLProcessor`` computes them (vLLM's ``video_embeds`` field of that name; SGLang's
``video_timestamps``).
"""

from __future__ import annotations

import reprlib
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from PIL import Image
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel
from transformers.video_utils import VideoMetadata

from mmencode.models.base import DecodedVideo, EncoderOutput, PreparedItem, VideoSampling
from mmencode.models.errors import MetadataError
from mmencode.models.qwen2_vl import Qwen2VLAdapter

SPLIT_FIELD = "deepstack_split"
TIMESTAMPS_FIELD = "timestamps"


class _Qwen3VideoTiming(Qwen2VLAdapter):
    """The video side Qwen3-VL and Qwen3.5 share: Qwen3-VL's video processor and per-patch timestamps."""

    video_processor_class = "Qwen3VLVideoProcessor"
    # The language side writes each temporal patch's "<t seconds>" from them: a precomputed clip needs them.
    required_video_metadata = ("video_grid_thw", TIMESTAMPS_FIELD)

    def _video_timing(self, clip: VideoMetadata, sampling: VideoSampling) -> dict[str, Any]:
        assert self.video_processor is not None
        return {TIMESTAMPS_FIELD: patch_timestamps(clip, int(self.video_processor.temporal_patch_size))}

    def video_tokens_from_metadata(self, metadata: Mapping[str, Any]) -> int:
        rows = super().video_tokens_from_metadata(metadata)
        patches = int(metadata["video_grid_thw"][0])
        stamps = metadata.get(TIMESTAMPS_FIELD)
        if stamps is None:
            raise MetadataError(TIMESTAMPS_FIELD, "is required: one time in seconds per temporal patch", missing=True)
        if (
            not isinstance(stamps, list)
            or len(stamps) != patches
            or not all(isinstance(t, (int, float)) and not isinstance(t, bool) and t >= 0 for t in stamps)
        ):
            raise MetadataError(
                TIMESTAMPS_FIELD,
                f"must be {patches} times in seconds, one per temporal patch of video_grid_thw, got "
                f"{reprlib.repr(stamps)}",
                missing=False,
            )
        return rows


def patch_timestamps(clip: VideoMetadata, temporal_patch_size: int) -> list[float]:
    """Seconds of each temporal patch: the mean of its first and last sampled frame's time, the last
    index repeated to fill the final patch (``Qwen3VLProcessor._calculate_timestamps``). A clip without
    a frame rate counts at 24 fps, as the processor does; a clip that was not sampled keeps every frame."""
    sampled = clip.frames_indices if clip.frames_indices is not None else range(clip.total_num_frames)
    indices = [int(i) for i in sampled]
    indices += [indices[-1]] * (-len(indices) % temporal_patch_size)
    fps = clip.fps or 24
    return [
        (indices[i] / fps + indices[i + temporal_patch_size - 1] / fps) / 2
        for i in range(0, len(indices), temporal_patch_size)
    ]


class Qwen3VLAdapter(_Qwen3VideoTiming):
    family = "qwen3_vl"
    tower_class: ClassVar[type[torch.nn.Module]] = Qwen3VLVisionModel

    @property
    def split(self) -> list[int]:
        """Widths of the row's blocks in order: the main embedding, then each DeepStack level."""
        width = int(self.config.out_hidden_size)
        return [width] * (1 + len(self.config.deepstack_visual_indexes))

    @property
    def hidden_size(self) -> int:
        return sum(self.split)

    @property
    def pooled_width(self) -> int:
        # The main embedding: what the language model splices in at its image tokens. The DeepStack
        # levels are added to its hidden states inside its first layers, not an image vector of their own.
        return self.split[0]

    def preprocess(self, image: Image.Image) -> PreparedItem:
        return self._with_split(super().preprocess(image))

    def preprocess_video(self, video: DecodedVideo, sampling: VideoSampling) -> PreparedItem:
        return self._with_split(super().preprocess_video(video, sampling))

    def _with_split(self, item: PreparedItem) -> PreparedItem:
        return PreparedItem(item.tensors, {**item.metadata, SPLIT_FIELD: self.split}, item.num_tokens)

    def tokens_from_metadata(self, metadata: Mapping[str, Any]) -> int:
        self._check_split(metadata)
        return super().tokens_from_metadata(metadata)

    def video_tokens_from_metadata(self, metadata: Mapping[str, Any]) -> int:
        self._check_split(metadata)
        return super().video_tokens_from_metadata(metadata)

    def _check_split(self, metadata: Mapping[str, Any]) -> None:
        # Optional for precomputed items, but a split that is not this model's is a different layout.
        given = metadata.get(SPLIT_FIELD)
        if given is not None and given != self.split:
            raise MetadataError(
                SPLIT_FIELD,
                f"must be {self.split} ([main | DeepStack levels] on this model), got {reprlib.repr(given)}",
                missing=False,
            )

    def _forward(self, batch: dict[str, torch.Tensor], items: Sequence[PreparedItem]) -> EncoderOutput:
        out = self.module(hidden_states=batch["pixel_values"], grid_thw=batch["image_grid_thw"])
        rows = torch.cat([out.pooler_output, *out.deepstack_features], dim=-1)
        return EncoderOutput(rows=rows, rows_per_item=None)


class Qwen3_5Adapter(_Qwen3VideoTiming):
    family = "qwen3_5"
    tower_class: ClassVar[type[torch.nn.Module]] = Qwen3_5VisionModel

    @property
    def hidden_size(self) -> int:
        return int(self.config.out_hidden_size)
