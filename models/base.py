"""The contract every encoder family implements.

An adapter turns one decoded image into model inputs plus the number of rows the language side will
reserve for it (computed from the processor's output and configs, never from the encoder's output),
runs the vision tower on a batch of such items, and knows which metadata a precomputed embedding
must carry so that its row count can be checked without the image.
"""

from __future__ import annotations

import abc
import reprlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

import numpy as np
import torch
from PIL import Image
from transformers import AutoConfig

from mmencode.models.errors import MetadataError, UnsupportedModalityError
from mmencode.models.processor_backend import Backend, processor_class_for
from mmencode.models.processor_config import ProcessorConfig, read_processor_config
from mmencode.models.weights import KeyMap

# What an item is: the file field it came in (``image``, ``video``, ``audio``), or a precomputed item's
# ``modality``.
Modality = Literal["image", "video", "audio"]


@dataclass(frozen=True, slots=True)
class PreparedItem:
    """One preprocessed image, ready to be batched with others of the same model."""

    # Every tensor is concatenated along dim 0 when items are batched.
    tensors: dict[str, torch.Tensor]
    # What the language side needs to place the rows (``image_grid_thw``, ``num_patches``...).
    metadata: dict[str, Any]
    # Rows the preprocessor predicts this image yields: the placeholder count on the language side.
    num_tokens: int


@dataclass(frozen=True, slots=True)
class DecodedVideo:
    """The frames of a clip its video processor keeps, decoded: ``(kept, height, width, 3)`` uint8 RGB; which
    of the clip's frames they are, how many it has, and its frame rate."""

    frames: np.ndarray
    fps: float | None
    width: int
    height: int
    total_frames: int
    indices: list[int]  # frames[i] is the clip's frame indices[i]


class FrameChoice(Protocol):
    """Someone else's way of picking and sizing a clip's frames before the checkpoint's video processor
    sees them (a peer's own decoder, say), handed to the adapter; this package names no one."""

    name: str  # in the content hash: other frames, other rows
    default_fps: float  # the rate it samples at when asked none (Qwen2.5-VL's timing reads it)

    def frame_indices(
        self, total_frames: int, clip_fps: float, *, fps: float | None, num_frames: int | None
    ) -> list[int]:
        """The clip's frames it keeps; ``ValueError`` where it refuses the clip."""
        ...

    def resize(self, frames: np.ndarray) -> Any:
        """``(kept, height, width, 3)`` uint8 frames as it hands them to the video processor."""
        ...


@dataclass(frozen=True, slots=True)
class VideoSampling:
    """Which frames of a clip the video processor keeps, and how: the checkpoint's video processor
    samples (``fps`` or ``num_frames`` as transformers' processor call arguments), unless ``choice`` is
    set, whose own frame choice and frame size then apply (``fps`` or ``num_frames`` as its settings)."""

    fps: float | None = None
    num_frames: int | None = None
    choice: FrameChoice | None = None

    @property
    def key(self) -> str:
        """Part of a video item's content hash: other frames, other rows. (The checkpoint's own sampling
        adds nothing, so hashes made before there were other choices still match.)"""
        key = f"fps={self.fps};num_frames={self.num_frames}"
        return key if self.choice is None else f"{key};rule={self.choice.name}"


@dataclass(frozen=True, slots=True)
class DecodedAudio:
    """A clip's sound as its feature extractor takes it: mono float32 samples at ``sampling_rate``."""

    samples: np.ndarray  # (n,) float32
    sampling_rate: int

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.sampling_rate


@dataclass(frozen=True, slots=True)
class EncoderOutput:
    """A batch's output rows, items in order, on the CPU in float32."""

    rows: torch.Tensor  # (total_rows, hidden_size)
    # Rows produced per item when the output layout attributes them (fixed and crop families);
    # ``None`` when the tower emits one packed sequence (dynamic resolution) and only the total is known.
    rows_per_item: list[int] | None


class EncoderAdapter(abc.ABC):
    """Adapts one transformers vision architecture to the service."""

    family: ClassVar[str]
    # Metadata fields a precomputed item must carry for its row count to be checked.
    required_metadata: ClassVar[tuple[str, ...]] = ()
    tower_class: ClassVar[type[torch.nn.Module]]
    # The family's PIL image processor; the torchvision backend uses its counterpart (models.processor_backend).
    processor_class: ClassVar[type]
    # Where the encoder's weights may sit in a checkpoint: candidate key prefixes.
    weight_prefixes: ClassVar[tuple[str, ...]] = ("",)
    # Other layouts the encoder's weights may come in (transformers 4 hub saves, OpenGVLab's...).
    key_maps: ClassVar[tuple[KeyMap, ...]] = ()
    # The batch's tensors computed in the model's dtype (bf16 on a GPU); the rest (grids, masks) keep theirs.
    float_inputs: ClassVar[tuple[str, ...]] = ("pixel_values",)

    def __init__(
        self,
        module: torch.nn.Module,
        processor: Any,
        config: Any,
        *,
        checkpoint: Path,
        device: torch.device,
        dtype: torch.dtype,
        fingerprint: str,
        processor_config: ProcessorConfig | None = None,
        image_processor_backend: Backend = "pil",
        video_processor: Any | None = None,
        video_fingerprint: str = "",
    ) -> None:
        self.module = module
        self.processor = processor
        self.config = config
        self.checkpoint = checkpoint
        self.device = device
        self.dtype = dtype
        # Identity of the loaded weights and configs: part of every content hash.
        self.fingerprint = fingerprint
        # The checkpoint's processor-level settings (``image_seq_length``...), read, never hard-coded.
        self.processor_config = processor_config or ProcessorConfig(image_processor={})
        # Which implementation ``processor`` is: part of the fingerprint, shown by /v1/models and /ready.
        self.image_processor_backend = image_processor_backend
        # The checkpoint's video processor (torchvision only), for the families that take videos; and
        # the identity of its settings, part of every video item's hash (never of an image's).
        self.video_processor = video_processor
        self.video_fingerprint = video_fingerprint

    @classmethod
    def load_config(cls, checkpoint: Path) -> Any:
        """The checkpoint's transformers config (families in other layouts convert theirs here)."""
        return AutoConfig.from_pretrained(checkpoint, local_files_only=True)

    @classmethod
    def load_processor_config(cls, checkpoint: Path, config: Any) -> ProcessorConfig:
        """The processor settings the checkpoint ships (see :mod:`models.processor_config`)."""
        return read_processor_config(checkpoint)

    @classmethod
    def build_processor(cls, config: ProcessorConfig, backend: Backend) -> Any:
        """The family's image processor on ``backend``, from the checkpoint's settings.

        The class the checkpoint names (``image_processor_type``) is never imported: a config naming a
        torchvision class loads with the PIL backend where torchvision is missing.
        """
        return processor_class_for(cls.processor_class, backend).from_dict(config.image_processor)  # type: ignore[attr-defined]

    # ----- what the service needs to know -----
    @property
    @abc.abstractmethod
    def hidden_size(self) -> int:
        """Width of the rows this service returns (after any merger or projector)."""

    @property
    def pooled_width(self) -> int:
        """The leading columns a pooled vector (``/v1/embeddings``) averages: the whole row, unless a
        family's rows carry more than what the language model splices in (Qwen3-VL's DeepStack levels)."""
        return self.hidden_size

    @abc.abstractmethod
    def preprocess(self, image: Image.Image) -> PreparedItem:
        """Run the checkpoint's image processor on one RGB image. Thread-safe, CPU only."""

    @abc.abstractmethod
    def tokens_from_metadata(self, metadata: Mapping[str, Any]) -> int:
        """Rows an item with this metadata yields; raises :class:`MetadataError` when it cannot tell."""

    # ----- video (the families whose towers take clips) -----
    # Metadata fields a precomputed video item must carry.
    required_video_metadata: ClassVar[tuple[str, ...]] = ()
    # The transformers video processor class the family's checkpoints name, when it has one.
    video_processor_class: ClassVar[str | None] = None

    @property
    def takes_video(self) -> bool:
        return self.video_processor is not None

    @property
    def default_video_fps(self) -> float | None:
        """The rate a clip is sampled at when its item asks for none, where the checkpoint's video processor
        would not sample by itself; ``None``: the processor's own rule decides."""
        return None

    def video_frames_to_keep(self, total_frames: int, fps: float | None, sampling: VideoSampling) -> list[int]:
        """Which frames of a clip of ``total_frames`` the checkpoint's video processor keeps, asked
        ``sampling``: decided before decoding, so only those are converted and held."""
        raise UnsupportedModalityError(f"{self.family} models take images only")

    def preprocess_video(self, video: DecodedVideo, sampling: VideoSampling) -> PreparedItem:
        """Run the checkpoint's video processor on the frames :meth:`video_frames_to_keep` chose. Thread-safe,
        CPU only."""
        raise UnsupportedModalityError(f"{self.family} models take images only")

    def video_tokens_from_metadata(self, metadata: Mapping[str, Any]) -> int:
        """Rows a video item with this metadata yields (as :meth:`tokens_from_metadata`)."""
        raise UnsupportedModalityError(f"{self.family} models take images only")

    # ----- audio (the families whose checkpoints carry an audio tower) -----
    # Metadata fields a precomputed audio item must carry.
    required_audio_metadata: ClassVar[tuple[str, ...]] = ()
    # False for an audio-only checkpoint (Qwen2-Audio): its items must be audio.
    takes_images: ClassVar[bool] = True

    @property
    def audio_sampling_rate(self) -> int | None:
        """The rate the feature extractor takes samples at; ``None`` for a model without an audio tower."""
        return None

    @property
    def takes_audio(self) -> bool:
        return self.audio_sampling_rate is not None

    @property
    def max_audio_seconds(self) -> float | None:
        """The longest clip the feature extractor takes whole (Whisper's: 30 s); ``None`` for no bound."""
        return None

    def preprocess_audio(self, audio: DecodedAudio) -> PreparedItem:
        """Run the checkpoint's feature extractor on one clip. Thread-safe, CPU only."""
        raise UnsupportedModalityError(f"{self.family} models take no audio")

    def audio_tokens_from_metadata(self, metadata: Mapping[str, Any]) -> int:
        """Rows an audio item with this metadata yields (as :meth:`tokens_from_metadata`)."""
        raise UnsupportedModalityError(f"{self.family} models take no audio")

    # ----- one entry per modality, for the scheduler -----
    def takes(self, modality: Modality) -> bool:
        """Whether this checkpoint encodes items of ``modality`` here."""
        return {"image": self.takes_images, "video": self.takes_video, "audio": self.takes_audio}[modality]

    def required_metadata_for(self, modality: Modality) -> tuple[str, ...]:
        """The metadata a precomputed item of ``modality`` must carry."""
        if modality == "video":
            return self.required_video_metadata
        return self.required_audio_metadata if modality == "audio" else self.required_metadata

    def tokens_for(self, modality: Modality, metadata: Mapping[str, Any]) -> int:
        """Rows a precomputed item of ``modality`` with this metadata yields (:class:`MetadataError` if unknown)."""
        if modality == "video":
            return self.video_tokens_from_metadata(metadata)
        return self.audio_tokens_from_metadata(metadata) if modality == "audio" else self.tokens_from_metadata(metadata)

    def warmup_item(self) -> PreparedItem:
        """The small item the warm-up forward and the CPU thread calibration encode."""
        return self.preprocess(self.warmup_image())

    @abc.abstractmethod
    def _forward(self, batch: dict[str, torch.Tensor], items: Sequence[PreparedItem]) -> EncoderOutput:
        """Run the tower on tensors already collated and moved to the device."""

    # ----- shared behaviour -----
    def forward(self, items: Sequence[PreparedItem]) -> EncoderOutput:
        """Encode a batch. Blocking: call it from the worker's thread, never from the event loop."""
        batch = {name: tensor.to(self.device) for name, tensor in self.collate(items).items()}
        for name in self.float_inputs:
            if name in batch:
                batch[name] = batch[name].to(self.dtype)
        with torch.inference_mode():
            out = self._forward(batch, items)
        return EncoderOutput(rows=out.rows.float().cpu(), rows_per_item=out.rows_per_item)

    def collate(self, items: Sequence[PreparedItem]) -> dict[str, torch.Tensor]:
        """Join the items' tensors into one batch; families whose images keep their own sizes pad here."""
        return {name: torch.cat([item.tensors[name] for item in items]) for name in items[0].tensors}

    def warmup_image(self) -> Image.Image:
        """A small image for the warm-up forward that readiness waits on.

        56x56 is a multiple of 14 and 28, so its patch grid merges under any usual merge size.
        """
        return Image.new("RGB", (56, 56), (127, 64, 200))

    @staticmethod
    def _int_field(metadata: Mapping[str, Any], field: str, minimum: int = 1) -> int:
        """``metadata[field]``, an integer of at least ``minimum`` (1, or 0 for a count that may be empty)."""
        value = _required(metadata, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise MetadataError(field, f"must be a {_KIND[minimum]} integer, got {value!r}", missing=False)
        return value

    @staticmethod
    def _int_list(metadata: Mapping[str, Any], field: str, names: Sequence[str], minimum: int = 1) -> list[int]:
        """``metadata[field]``, a list like ``[t, h, w]`` (``names``) of integers of at least ``minimum``."""
        value = _required(metadata, field)
        if (
            not isinstance(value, list)
            or len(value) != len(names)
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= minimum for v in value)
        ):
            count = _COUNT[len(names)]
            raise MetadataError(
                field,
                f"must be {count} {_KIND[minimum]} integers [{', '.join(names)}], got {reprlib.repr(value)}",
                missing=False,
            )
        return value


_KIND = {0: "non-negative", 1: "positive"}
_COUNT = {2: "two", 3: "three"}


def _required(metadata: Mapping[str, Any], field: str) -> Any:
    value = metadata.get(field)
    if value is None:
        raise MetadataError(field, "is required for precomputed items of this model", missing=True)
    return value
