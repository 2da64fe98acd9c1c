"""Video files to frames: mp4, webm, mkv (anything FFmpeg demuxes) as RGB arrays, with their timing.

Decoded on the CPU with PyAV (FFmpeg inside its wheel; the ``video`` extra), each frame as PyAV's
``rgb24`` conversion gives it: the pixels transformers' own PyAV loader hands its video processors.

Only the frames the model's video processor keeps are converted and held: a first pass counts the
stream's frames without decoding them, the caller's ``keep`` (the checkpoint's own sampling rule) picks
their indices, and the decoding pass converts those alone. A one-minute 720p clip sampled at 2 fps
holds 120 frames in memory, not 1,800. Should the decoder hand over a different number of frames than
were counted, the indices are picked again from the frames that decoded, and the file decoded once more.

Limits are checked before the expensive step: the clip's length and frame size as the container
declares them, before any frame is decoded (a ten-hour header is refused at once); the length the count
finds; then the frames kept and their bytes, before decoding. Failures are
:class:`~app.engine.errors.InvalidVideo` or :class:`~app.engine.errors.PayloadTooLarge` without item context; the
scheduler adds which item it was.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mmencode.app.engine.errors import InvalidImage, InvalidVideo, PayloadTooLarge
from mmencode.app.media.image import decode_image, is_image_container
from mmencode.models.base import DecodedVideo

__all__ = [
    "FrameChooser",
    "VideoLimits",
    "decode_frame_list",
    "decode_video",
    "pack_frames",
    "unpack_frames",
    "video_support",
]

# (frames in the clip, its frame rate) -> indices of the frames to keep, in order.
FrameChooser = Callable[[int, float | None], Sequence[int]]


@dataclass(frozen=True, slots=True)
class VideoLimits:
    max_seconds: float
    max_frames: int  # frames kept for the encoder, after sampling
    max_frame_pixels: int
    max_decoded_bytes: int


def video_support() -> str | None:
    """``None`` when videos can be decoded here; otherwise why not, with the fix."""
    try:
        import av  # noqa: F401
    except ImportError:
        return "video decoding needs PyAV: pip install 'mmencode[video]' (or pip install av)"
    return None


def decode_video(data: bytes, limits: VideoLimits, keep: FrameChooser) -> DecodedVideo:
    """The frames ``keep`` picks from the file's first video stream, ``(kept, height, width, 3)`` uint8 RGB."""
    header = _read_header(data, limits)
    counted = _count_frames(data)
    if counted == 0:
        raise _not_a_video("the video stream holds no frame")
    if counted < header.declared_frames:
        raise _truncated(header.declared_frames, counted)
    # The length its frames make at a rate no camera's clip exceeds: a header claiming a million frames a
    # second (or none) cannot pass millions of frames off as a short clip; every frame is decoded.
    _check_seconds(counted / _plausible_fps(header.fps), "its frames last", limits)
    total = counted
    for _ in range(2):
        indices = [int(i) for i in keep(total, header.fps)]
        _check_kept(indices, total, header, limits)
        frames, decoded = _decode_frames(data, indices, limits)
        if decoded == 0:
            raise _not_a_video("the video stream holds no frame")
        if decoded < header.declared_frames:
            raise _truncated(header.declared_frames, decoded)
        if decoded == total and frames is not None:
            break
        total = decoded  # the decoder's count is the clip's: pick from what decodes, once more
    else:
        raise InvalidVideo(f"the video decodes to a different number of frames on each pass ({counted}, {total})")
    return DecodedVideo(
        frames=frames,
        fps=header.fps,
        width=frames.shape[2],
        height=frames.shape[1],
        total_frames=total,
        indices=indices,
    )


def pack_frames(files: Sequence[bytes]) -> bytes:
    """A frame list's image files as one blob, each behind its 8-byte length: what its hash covers (the
    same images in another order or split are other bytes) and what the pool decodes."""
    return b"".join(len(data).to_bytes(8, "little") + data for data in files)


def unpack_frames(blob: bytes) -> list[bytes]:
    files, at = [], 0
    while at < len(blob):
        size = int.from_bytes(blob[at : at + 8], "little")
        files.append(blob[at + 8 : at + 8 + size])
        at += 8 + size
    return files


def decode_frame_list(files: Sequence[bytes], fps: float, limits: VideoLimits, max_pixels: int) -> DecodedVideo:
    """A clip given as its frames, already sampled: every frame is kept, in order, at ``fps``."""
    frames: list[np.ndarray] = []
    for position, data in enumerate(files):
        try:
            image = decode_image(data, max_pixels=max_pixels)
        except InvalidImage as exc:
            raise InvalidVideo(f"frame {position} of the list: {exc.message}") from None
        pixels = np.asarray(image, dtype=np.uint8)
        if frames and pixels.shape != frames[0].shape:
            height, width = frames[0].shape[:2]
            raise InvalidVideo(
                f"frame {position} of the list is {image.width}x{image.height}, frame 0 {width}x{height}: the frames "
                "of a clip have one size",
                details={"frame": position},
            )
        frames.append(pixels)
        if len(frames) * pixels.nbytes > limits.max_decoded_bytes:
            raise _too_many_bytes(limits)
    return DecodedVideo(
        frames=np.stack(frames),
        fps=fps,
        width=frames[0].shape[1],
        height=frames[0].shape[0],
        total_frames=len(frames),
        indices=list(range(len(frames))),
    )


@dataclass(frozen=True, slots=True)
class _Header:
    fps: float | None
    width: int
    height: int
    declared_frames: int  # 0 when the container does not say (Matroska, WebM)


def _open(data: bytes) -> Any:
    import av

    try:
        return av.open(io.BytesIO(data), mode="r", metadata_errors="ignore")
    except (av.error.FFmpegError, ValueError, UnicodeDecodeError) as exc:
        raise _not_a_video(f"{type(exc).__name__}: {exc}") from None


def _read_header(data: bytes, limits: VideoLimits) -> _Header:
    """What the container says, before a frame is decoded."""
    with _open(data) as container:
        if is_image_container(container.format.name):
            raise InvalidVideo(
                f"this file is an image ({container.format.name.removesuffix('_pipe')}), not a video: send it as "
                "`image`",
                details={"format": container.format.name},
            )
        if not container.streams.video:
            raise _not_a_video("the file has no video stream")
        stream = container.streams.video[0]
        fps = float(stream.average_rate) if stream.average_rate else None
        header = _Header(fps, stream.codec_context.width or 0, stream.codec_context.height or 0, stream.frames or 0)
        _check_frame_size(header.width, header.height, limits)
        if stream.duration and stream.time_base:
            _check_seconds(float(stream.duration * stream.time_base), "its header declares", limits)
        elif container.duration:  # microseconds, all streams: only when the video's own is not given
            _check_seconds(container.duration / 1_000_000, "its header declares", limits)
        if header.declared_frames and fps:
            _check_seconds(header.declared_frames / fps, "its header declares", limits)
        return header


def _count_frames(data: bytes) -> int:
    """The video stream's frames, counted from its packets without decoding them."""
    import av

    with _open(data) as container:
        stream = container.streams.video[0]
        try:
            return sum(1 for packet in container.demux(stream) if packet.size)
        except av.error.FFmpegError as exc:
            raise _not_a_video(f"{type(exc).__name__} while reading its packets: {exc}") from None


def _check_kept(indices: list[int], total: int, header: _Header, limits: VideoLimits) -> None:
    if not indices or min(indices) < 0 or max(indices) >= total:
        raise InvalidVideo(f"the video processor picked frames outside the clip's {total}")
    if len(indices) > limits.max_frames:
        raise PayloadTooLarge(
            f"the video is too long: {len(indices)} frames at this sampling, over the limit of {limits.max_frames} "
            "(--max-video-frames); ask for fewer (fps, num_frames)",
            details={"limit": "max_video_frames", "max_frames": limits.max_frames, "frames": len(indices)},
        )
    if len(indices) * header.width * header.height * 3 > limits.max_decoded_bytes:  # rows, repeats included
        raise _too_many_bytes(limits)


def _decode_frames(data: bytes, indices: list[int], limits: VideoLimits) -> tuple[np.ndarray | None, int]:
    """Decode every frame (a codec needs its references) and convert the ones at ``indices`` into one array,
    in their order; and how many frames decoded. ``None`` for the array when an index was past the end."""
    import av

    positions: dict[int, list[int]] = {}
    for position, index in enumerate(indices):
        positions.setdefault(index, []).append(position)
    out: np.ndarray | None = None
    filled = decoded = 0
    budget = _frame_budget(limits)
    with _open(data) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        try:
            for frame in container.decode(stream):
                _check_frame_size(frame.width, frame.height, limits)
                if decoded >= budget:  # more frames decode than its packets said: stop here
                    raise PayloadTooLarge(
                        f"the video decodes to more than {budget} frames, longer than --max-video-seconds "
                        f"({limits.max_seconds:g} s) at any plausible frame rate",
                        details={"limit": "max_video_seconds", "max_seconds": limits.max_seconds},
                    )
                if decoded in positions:
                    pixels = frame.to_ndarray(format="rgb24")
                    if out is None:
                        if len(indices) * pixels.nbytes > limits.max_decoded_bytes:  # larger than declared
                            raise _too_many_bytes(limits)
                        out = np.empty((len(indices), *pixels.shape), np.uint8)
                    elif pixels.shape != out.shape[1:]:
                        raise InvalidVideo("the video's frames change size mid-stream; re-encode it at one size")
                    for position in positions[decoded]:
                        out[position] = pixels
                    filled += 1
                decoded += 1
        except av.error.FFmpegError as exc:
            raise _not_a_video(f"{type(exc).__name__} after {decoded} frames: {exc}") from None
    return (out if filled == len(positions) else None), decoded


# Frame rates past this are counted as this when a clip's length is judged from its frames (high-speed
# footage is slowed down before it is a video file); a clip that states none counts at 24, as
# transformers assumes.
_MAX_PLAUSIBLE_FPS, _DEFAULT_FPS = 120.0, 24.0


def _plausible_fps(fps: float | None) -> float:
    return min(fps, _MAX_PLAUSIBLE_FPS) if fps else _DEFAULT_FPS


def _frame_budget(limits: VideoLimits) -> int:
    """The most frames one decoding pass may go through: the longest clip at the highest plausible rate."""
    return int(limits.max_seconds * _MAX_PLAUSIBLE_FPS)


def _check_seconds(seconds: float, what: str, limits: VideoLimits) -> None:
    if seconds > limits.max_seconds:
        raise PayloadTooLarge(
            f"the video is too long: {what} {seconds:.1f} s, over the limit of {limits.max_seconds:g} s "
            "(--max-video-seconds)",
            details={"limit": "max_video_seconds", "max_seconds": limits.max_seconds, "seconds": round(seconds, 3)},
        )


def _too_many_bytes(limits: VideoLimits) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"the frames kept decode to more than {limits.max_decoded_bytes} bytes of RGB, the limit "
        "(--max-video-decoded-bytes); ask for fewer frames (fps, num_frames) or send a smaller video",
        details={"limit": "max_video_decoded_bytes", "max_bytes": limits.max_decoded_bytes},
    )


def _truncated(declared: int, found: int) -> InvalidVideo:
    # Cut short (an upload or a download that stopped): rows for part of a clip would pass for the clip.
    return InvalidVideo(
        f"the video is truncated: its header declares {declared} frames, but only {found} decode",
        details={"declared_frames": declared, "decoded_frames": found},
    )


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


def _not_a_video(reason: str) -> InvalidVideo:
    return InvalidVideo(f"not a video FFmpeg can decode ({reason}); send an mp4, webm or mkv file")
