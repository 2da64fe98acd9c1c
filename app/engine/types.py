"""The engine's own types: the items a request asks for, what it answers for each, and its limits.

The APIs turn their wire payloads into these (``app/api/*/request.py``, SGLang's bridge); the engine
knows no pydantic schema. An item is one of three kinds, by what it carries: an image, a video (a
file, or frames already sampled) or audio. An item without a file names a content ``hash`` answered
before, or carries a ``precomputed`` embedding of that kind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch

from mmencode.app.media.audio import AudioLimits
from mmencode.app.media.video import VideoLimits
from mmencode.models.base import Modality

__all__ = [
    "AudioItem",
    "ImageItem",
    "Item",
    "ItemResult",
    "Limits",
    "Modality",
    "Precomputed",
    "SamplingRule",
    "Source",
    "VideoItem",
]

# A file as the client sent it: ``str`` is a data URI, bare base64 or an http(s) URL; ``bytes`` an upload.
Source = str | bytes
# Whose frame choice a video item follows: the checkpoint's video processor's, or SGLang's own (for a
# server behind SGLang's encoder protocol, which decodes clips itself). ``--video-sampling`` sets the
# default; the engine is given the choice each rule names (app/server.py).
SamplingRule = Literal["checkpoint", "sglang"]
PrecomputedDtype = Literal["float32", "float16", "bfloat16"]


@dataclass(frozen=True, slots=True)
class Precomputed:
    """Rows the caller already has: base64 text, the raw little-endian bytes of a file part, or numbers."""

    data: str | bytes | Sequence[Sequence[float]]
    dtype: PrecomputedDtype
    shape: tuple[int, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Item:
    embedding: Precomputed | None = None
    # Echoed back; for a precomputed item, what its row count is checked against (image_grid_thw...).
    metadata: Mapping[str, Any] = field(default_factory=dict)
    hash: str | None = None  # a content hash answered before: the rows come from the cache

    kind: ClassVar[Modality]

    @property
    def source(self) -> Source | list[str] | None:
        raise NotImplementedError


@dataclass(frozen=True, slots=True, kw_only=True)
class ImageItem(_Item):
    kind: ClassVar[Modality] = "image"
    file: Source | None = None

    @property
    def source(self) -> Source | None:
        return self.file


@dataclass(frozen=True, slots=True, kw_only=True)
class VideoItem(_Item):
    kind: ClassVar[Modality] = "video"
    # An mp4, webm or mkv file (as ``ImageItem.file``), or a list of frames already sampled (each an image).
    file: Source | list[str] | None = None
    # The frames asked for (a file's): a rate or a count, under a rule (None: the server's).
    fps: float | None = None
    num_frames: int | None = None
    rule: SamplingRule | None = None
    frames_fps: float | None = None  # a frame list's: the rate its frames were sampled at

    @property
    def source(self) -> Source | list[str] | None:
        return self.file


@dataclass(frozen=True, slots=True, kw_only=True)
class AudioItem(_Item):
    kind: ClassVar[Modality] = "audio"
    file: Source | None = None  # a wav, flac, mp3 or ogg file

    @property
    def source(self) -> Source | None:
        return self.file


Item = ImageItem | VideoItem | AudioItem


@dataclass(frozen=True, slots=True)
class ItemResult:
    index: int
    source: Literal["encoder", "precomputed", "cache"]
    hash: str | None
    metadata: dict[str, Any]
    rows: torch.Tensor  # (num_tokens, hidden_size) float32

    @property
    def num_tokens(self) -> int:
        return int(self.rows.shape[0])


@dataclass(frozen=True, slots=True)
class Limits:
    """What one request may ask, in the units of the settings that set each (``--max-...``)."""

    max_items: int
    max_image_bytes: int
    max_image_pixels: int
    max_embedding_bytes: int
    request_timeout: float
    max_video_bytes: int
    video: VideoLimits
    max_video_tokens: int
    max_audio_bytes: int
    audio: AudioLimits
