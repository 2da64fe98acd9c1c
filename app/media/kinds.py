"""What a file is meant to be: an image, a video or audio; its word in messages, error and byte limit."""

from __future__ import annotations

from dataclasses import dataclass

from mmencode.app.engine.errors import InvalidAudio, InvalidImage, InvalidRequest, InvalidVideo
from mmencode.models.base import Modality

__all__ = ["AUDIO", "IMAGE", "KINDS", "VIDEO", "MediaKind"]


@dataclass(frozen=True, slots=True)
class MediaKind:
    name: Modality  # its word in messages and its data URIs' media type ("image/...")
    error: type[InvalidRequest]  # what a file that is not one raises
    limit: str  # the setting that bounds one file's bytes

    @property
    def flag(self) -> str:
        """The command-line flag of its limit, for messages: ``--max-image-bytes``."""
        return "--" + self.limit.replace("_", "-")


IMAGE = MediaKind("image", InvalidImage, "max_image_bytes")
VIDEO = MediaKind("video", InvalidVideo, "max_video_bytes")
AUDIO = MediaKind("audio", InvalidAudio, "max_audio_bytes")
KINDS: dict[Modality, MediaKind] = {kind.name: kind for kind in (IMAGE, VIDEO, AUDIO)}
