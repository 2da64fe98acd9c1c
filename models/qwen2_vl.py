"""Dynamic resolution: the Qwen2-VL and Qwen2.5-VL vision towers.

Each image becomes ``t*h*w`` patches; the tower's merger folds ``merge_size**2`` neighbours into one
row of the language model's width, so an image yields ``t*h*w / merge_size**2`` rows. Images of any
sizes are packed into one forward: concatenated patches plus one ``grid_thw`` row per image.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from PIL import Image
from transformers import Qwen2VLImageProcessorPil
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel
from transformers.video_utils import VideoMetadata

from mmencode.models.base import DecodedVideo, EncoderAdapter, EncoderOutput, PreparedItem, VideoSampling
from mmencode.models.dynamic_preprocess import DynamicResolutionPreprocessor, TorchvisionDynamicResolutionPreprocessor
from mmencode.models.errors import MetadataError, UnsupportedModalityError

# A clip that states no frame rate counts at 24 frames a second, as transformers' VideoMetadata and
# SGLang's encoder count it.
_UNKNOWN_FPS = 24.0


class Qwen2VLAdapter(EncoderAdapter):
    family = "qwen2_vl"
    required_metadata = ("image_grid_thw",)
    tower_class: ClassVar[type[torch.nn.Module]] = Qwen2VisionTransformerPretrainedModel
    processor_class: ClassVar[type] = Qwen2VLImageProcessorPil
    # Where the tower sits: transformers 5 full save, original hub layout, standalone tower.
    weight_prefixes: ClassVar[tuple[str, ...]] = ("model.visual.", "visual.", "")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Fewer passes over the pixels, used only once it matched this checkpoint's processor bit for
        # bit on probe images (see models.dynamic_preprocess); otherwise transformers' processor, as
        # for the subclasses whose processors are other classes (GLM-4.1V, Kimi).
        fast: type[DynamicResolutionPreprocessor] = (
            TorchvisionDynamicResolutionPreprocessor
            if self.image_processor_backend == "torchvision"
            else DynamicResolutionPreprocessor
        )
        self.fast_preprocessor = fast.verified(self.processor, label=f"{self.family} encoder")

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def merge_size(self) -> int:
        # The processor's value, as the language side uses it to count placeholders.
        return int(self.processor.merge_size)

    def preprocess(self, image: Image.Image) -> PreparedItem:
        out = self.fast_preprocessor(image) if self.fast_preprocessor is not None else None
        if out is None:
            out = self.processor(images=[image], return_tensors="pt")
        grid = out["image_grid_thw"]
        t, h, w = (int(v) for v in grid[0])
        return PreparedItem(
            tensors={"pixel_values": out["pixel_values"], "image_grid_thw": grid},
            metadata={"image_grid_thw": [t, h, w]},
            num_tokens=t * h * w // self.merge_size**2,
        )

    def tokens_from_metadata(self, metadata: Mapping[str, Any]) -> int:
        return self._tokens_of_grid(metadata, "image_grid_thw")

    def _tokens_of_grid(self, metadata: Mapping[str, Any], field: str) -> int:
        grid = self._int_list(metadata, field, ("t", "h", "w"))
        if (grid[1] % self.merge_size) or (grid[2] % self.merge_size):
            raise MetadataError(
                field,
                f"h and w must be multiples of merge_size {self.merge_size}, got {reprlib.repr(grid)}",
                missing=False,
            )
        return math.prod(grid) // self.merge_size**2

    # ----- video: the same tower, over patches that span `temporal_patch_size` frames -----
    video_processor_class: ClassVar[str | None] = "Qwen2VLVideoProcessor"
    required_video_metadata: ClassVar[tuple[str, ...]] = ("video_grid_thw",)

    # Qwen's own clip loader (qwen-vl-utils, FPS = 2) samples 2 frames a second, and so do the servers that
    # serve these checkpoints; transformers' Qwen2VLVideoProcessor keeps every frame unless told (an 8 s 30 fps
    # clip: 7,200 rows instead of 480). A checkpoint whose processor config samples keeps its own rule.
    QWEN_FPS: ClassVar[float] = 2.0

    @property
    def default_video_fps(self) -> float | None:
        processor = self.video_processor
        if processor is None or getattr(processor, "do_sample_frames", False):
            return None
        return self.QWEN_FPS

    # What transformers' BaseVideoProcessor.preprocess takes out of its arguments before it binds the rest
    # to sample_frames.
    _NOT_SAMPLING_ARGUMENTS = ("input_data_format", "do_convert_rgb", "do_sample_frames", "device", "video_metadata")

    def video_frames_to_keep(self, total_frames: int, fps: float | None, sampling: VideoSampling) -> list[int]:
        processor = self._require_video_processor()
        if sampling.choice is not None:
            clip_fps = fps or _UNKNOWN_FPS
            return sampling.choice.frame_indices(
                total_frames, clip_fps, fps=sampling.fps, num_frames=sampling.num_frames
            )
        # The processor's own sample_frames, called as its preprocess calls it: every valid argument, the
        # checkpoint's value unless the item asks for another.
        asked = self._sampling_arguments(sampling)
        arguments = {
            name: asked.get(name, getattr(processor, name, None)) for name in processor.valid_kwargs.__annotations__
        }
        if not arguments["do_sample_frames"]:
            return list(range(total_frames))
        for name in self._NOT_SAMPLING_ARGUMENTS:
            arguments.pop(name, None)
        indices = processor.sample_frames(metadata=self._clip(total_frames, fps), **arguments)
        return [int(i) for i in indices]

    def preprocess_video(self, video: DecodedVideo, sampling: VideoSampling) -> PreparedItem:
        processor = self._require_video_processor()
        clip = self._clip(video.total_frames, video.fps, video.width, video.height)
        clip.frames_indices = list(video.indices)
        # Another choice of frames may resize them before the processor resizes them again (SGLang does, to
        # its own pixel limits): two resamplings, both kept, or the pixels would not be that peer's.
        frames = sampling.choice.resize(video.frames) if sampling.choice is not None else video.frames
        # The frames are the ones video_frames_to_keep picked: the processor takes them as it takes its
        # own sample, with the indices in the metadata for the timing.
        out = processor(
            videos=[frames],
            video_metadata=[clip],
            do_sample_frames=False,
            return_tensors="pt",
            return_metadata=True,
        )
        grid = out["video_grid_thw"]
        t, h, w = (int(v) for v in grid[0])
        return PreparedItem(
            # The tower takes a clip's patches as it takes an image's: one batch may hold both.
            tensors={"pixel_values": out["pixel_values_videos"], "image_grid_thw": grid},
            metadata={"video_grid_thw": [t, h, w], **self._video_timing(out["video_metadata"][0], sampling)},
            num_tokens=t * h * w // self.merge_size**2,
        )

    def _require_video_processor(self) -> Any:
        if self.video_processor is None:
            raise UnsupportedModalityError(
                f"this {self.family} checkpoint serves images only here: it has no video processor settings, "
                "or torchvision is missing"
            )
        return self.video_processor

    @staticmethod
    def _sampling_arguments(sampling: VideoSampling) -> dict[str, Any]:
        if sampling.fps is None and sampling.num_frames is None:
            return {}  # the checkpoint's rule
        return {"do_sample_frames": True, "fps": sampling.fps, "num_frames": sampling.num_frames}

    @staticmethod
    def _clip(
        total_frames: int, fps: float | None, width: int | None = None, height: int | None = None
    ) -> VideoMetadata:
        return VideoMetadata(
            total_num_frames=total_frames,
            fps=fps,
            width=width,
            height=height,
            duration=total_frames / fps if fps else None,
        )

    def _video_timing(self, clip: VideoMetadata, sampling: VideoSampling) -> dict[str, Any]:
        """What the language side needs beside the grid to place a clip's rows in time (none for Qwen2-VL)."""
        return {}

    def video_tokens_from_metadata(self, metadata: Mapping[str, Any]) -> int:
        if self.video_processor_class is None:
            raise UnsupportedModalityError(f"{self.family} models take images only here")
        return self._tokens_of_grid(metadata, "video_grid_thw")

    def _forward(self, batch: dict[str, torch.Tensor], items: Sequence[PreparedItem]) -> EncoderOutput:
        out = self.module(hidden_states=batch["pixel_values"], grid_thw=batch["image_grid_thw"])
        # One packed sequence for the whole batch: only the total row count is observable.
        return EncoderOutput(rows=out.pooler_output, rows_per_item=None)


class Qwen2_5_VLAdapter(Qwen2VLAdapter):
    family = "qwen2_5_vl"
    tower_class = Qwen2_5_VisionTransformerPretrainedModel

    def _video_timing(self, clip: VideoMetadata, sampling: VideoSampling) -> dict[str, Any]:
        # Qwen2.5-VL's rotary time index: seconds per temporal patch, as Qwen2_5_VLProcessor computes it
        # from the rate the frames were sampled at; another frame choice (SGLang's encoder) from the rate
        # it was set to sample at, whatever its rounding made of it.
        assert self.video_processor is not None
        choice = sampling.choice
        rate = (sampling.fps or choice.default_fps) if choice is not None else clip.sampled_fps
        return {"second_per_grid_ts": self.video_processor.temporal_patch_size / rate}

    @property
    def hidden_size(self) -> int:
        return int(self.config.out_hidden_size)
