"""Video files to frames: mp4, webm, mkv (anything FFmpeg demuxes) as RGB arrays, with their timing.

Decoded on the CPU with PyAV (FFmpeg inside its wheel; the ``video`` extra), each frame as PyAV's
``rgb24`` conversion gives it: the pixels transformers' own PyAV loader hands its video processors.
Every frame is kept; the checkpoint's video processor samples them (``fps``, ``num_frames``), as
transformers does after its loader.

Limits are checked before the expensive step: the frame count and frame size the container declares
before any frame is decoded (a ten-hour header is refused at once), then the frames and bytes actually
decoded, so a file that lies in its header stops at the limit. Failures are
:class:`~app.errors.InvalidVideo` or :class:`~app.errors.PayloadTooLarge` without item context; the
scheduler adds which item it was.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from mmencode.app.errors import InvalidVideo, PayloadTooLarge
from mmencode.app.images import MediaKind
from mmencode.models.base import DecodedVideo

__all__ = ["VIDEO", "VideoLimits", "decode_video", "video_support"]

VIDEO = MediaKind("video", InvalidVideo, "max_video_bytes")


@dataclass(frozen=True, slots=True)
class VideoLimits:
    max_frames: int
    max_frame_pixels: int
    max_decoded_bytes: int


def video_support() -> str | None:
    """``None`` when videos can be decoded here; otherwise why not, with the fix."""
    try:
        import av  # noqa: F401
    except ImportError:
        return "video decoding needs PyAV: pip install 'mmencode[video]' (or pip install av)"
    return None


def decode_video(data: bytes, limits: VideoLimits) -> DecodedVideo:
    """Every frame of the file's first video stream, ``(frames, height, width, 3)`` uint8 RGB."""
    import av

    try:
        container = av.open(io.BytesIO(data), mode="r", metadata_errors="ignore")
    except (av.error.FFmpegError, ValueError, UnicodeDecodeError) as exc:
        raise _not_a_video(f"{type(exc).__name__}: {exc}") from None
    with container:
        if _is_image_format(container.format.name):
            raise InvalidVideo(
                f"this file is an image ({container.format.name.removesuffix('_pipe')}), not a video: send it as "
                "`image`",
                details={"format": container.format.name},
            )
        if not container.streams.video:
            raise _not_a_video("the file has no video stream")
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        fps = float(stream.average_rate) if stream.average_rate else None
        _check_declared(stream, container, fps, limits)
        frames: list[np.ndarray] = []
        decoded_bytes = 0
        try:
            for frame in container.decode(stream):
                _check_frame_size(frame.width, frame.height, limits)
                if len(frames) >= limits.max_frames:
                    raise _too_many_frames(f"more than {limits.max_frames} frames", limits)
                pixels = frame.to_ndarray(format="rgb24")
                decoded_bytes += pixels.nbytes
                if decoded_bytes > limits.max_decoded_bytes:
                    raise PayloadTooLarge(
                        f"the decoded frames pass {limits.max_decoded_bytes} bytes, the limit "
                        "(--max-video-decoded-bytes)",
                        details={"limit": "max_video_decoded_bytes", "max_bytes": limits.max_decoded_bytes},
                    )
                frames.append(pixels)
        except av.error.FFmpegError as exc:
            raise _not_a_video(f"{type(exc).__name__} after {len(frames)} frames: {exc}") from None
        declared = stream.frames or 0
    if not frames:
        raise _not_a_video("the video stream holds no frame")
    if len(frames) < declared:
        # Cut short (an upload or a download that stopped): rows for part of a clip would pass for the clip.
        raise InvalidVideo(
            f"the video is truncated: its header declares {declared} frames, but only {len(frames)} decode",
            details={"declared_frames": declared, "decoded_frames": len(frames)},
        )
    if len({f.shape for f in frames}) > 1:
        raise InvalidVideo("the video's frames change size mid-stream; re-encode it at one size")
    return DecodedVideo(frames=np.stack(frames), fps=fps, width=frames[0].shape[1], height=frames[0].shape[0])


def _is_image_format(name: str) -> bool:
    """FFmpeg opens still images as one-frame videos (``png_pipe``, ``image2``...) and GIFs as clips:
    neither is what a video item means, and their rows would be counted as a video's."""
    return name.endswith("_pipe") or name in {"image2", "gif", "apng"}


def _check_declared(stream: Any, container: Any, fps: float | None, limits: VideoLimits) -> None:
    """What the header says, before a frame is decoded."""
    _check_frame_size(stream.codec_context.width or 0, stream.codec_context.height or 0, limits)
    declared = stream.frames or 0
    if not declared and fps and container.duration:
        declared = int(container.duration / 1_000_000 * fps)  # container.duration is in microseconds
    if declared > limits.max_frames:
        raise _too_many_frames(f"its header declares {declared} frames", limits)


def _check_frame_size(width: int, height: int, limits: VideoLimits) -> None:
    if width * height > limits.max_frame_pixels:
        raise PayloadTooLarge(
            f"video frames of {width}x{height} pixels are over the limit of {limits.max_frame_pixels} per frame "
            "(--max-image-pixels)",
            details={
                "limit": "max_image_pixels",
                "max_pixels": limits.max_frame_pixels,
                "width": width,
                "height": height,
            },
        )


def _too_many_frames(what: str, limits: VideoLimits) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"the video is too long: {what}, over the limit of {limits.max_frames} (--max-video-frames)",
        details={"limit": "max_video_frames", "max_frames": limits.max_frames},
    )


def _not_a_video(reason: str) -> InvalidVideo:
    return InvalidVideo(f"not a video FFmpeg can decode ({reason}); send an mp4, webm or mkv file")
