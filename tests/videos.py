"""Test clips, encoded with PyAV (FFmpeg inside its wheel): smooth moving gradients plus noise, so
that every frame differs and a codec keeps them apart."""

from __future__ import annotations

import base64
import io
from fractions import Fraction

import av
import numpy as np

__all__ = ["clip", "clip_frames", "video_data_uri"]


def clip_frames(frames: int, width: int, height: int, seed: int = 0) -> np.ndarray:
    """``(frames, height, width, 3)`` uint8: what the clip holds before the codec."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    out = np.empty((frames, height, width, 3), np.uint8)
    for i in range(frames):
        base = np.sin((x + 3 * i) / 9.0) * 70 + np.cos((y - 2 * i) / 7.0) * 50 + 128
        noise = rng.normal(0, 12, (height, width, 3))
        out[i] = np.clip(base[..., None] + noise + np.array([0, 25, -25]), 0, 255).astype(np.uint8)
    return out


# container -> (FFmpeg format, codec, pixel format, media type)
_CONTAINERS = {
    "mp4": ("mp4", "libx264", "yuv420p", "video/mp4"),
    "mkv": ("matroska", "ffv1", "yuv444p", "video/x-matroska"),
    # PNG frames: lossless RGB, so every decoder (vLLM's OpenCV, mmencode's PyAV) gives the same pixels.
    "avi": ("avi", "png", "rgb24", "video/x-msvideo"),
    "webm": ("webm", "libvpx-vp9", "yuv420p", "video/webm"),
}


def clip(frames: int, width: int, height: int, *, fps: int = 10, seed: int = 0, container: str = "mp4") -> bytes:
    """A file of ``frames`` frames at ``fps``: mp4 (H.264), mkv (FFV1), avi (PNG frames) or webm (VP9)."""
    fmt, codec, pix_fmt, _ = _CONTAINERS[container]
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=fmt) as output:
        stream = output.add_stream(codec, rate=Fraction(fps))
        stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
        if codec == "libx264":
            stream.options = {"preset": "ultrafast", "crf": "18"}
        for pixels in clip_frames(frames, width, height, seed):
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                output.mux(packet)
        for packet in stream.encode():
            output.mux(packet)
    return buffer.getvalue()


def video_data_uri(data: bytes, container: str = "mp4") -> str:
    return f"data:{_CONTAINERS[container][3]};base64," + base64.b64encode(data).decode()
