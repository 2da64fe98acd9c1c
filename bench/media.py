"""Synthetic media for the bench scripts and the tests: clips (PyAV, FFmpeg inside its wheel) and sounds.

Video: smooth moving gradients plus noise, so that every frame differs and a codec keeps them apart.
Audio: chirps under noise, written by the standard library (wav) and PyAV (flac, ogg, mp3).
"""

from __future__ import annotations

import base64
import io
import wave
from fractions import Fraction

import av
import numpy as np

from bench.client import data_uri

__all__ = ["as_float", "audio_data_uri", "clip", "clip_frames", "encoded", "tone", "video_data_uri", "wav"]


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


def tone(seconds: float, rate: int, channels: int = 1, seed: int = 0) -> np.ndarray:
    """``(samples, channels)`` int16: a chirp under noise, different in every channel."""
    rng = np.random.default_rng(seed)
    n = round(seconds * rate)
    t = np.arange(n) / rate
    waves = [
        np.sin(2 * np.pi * (220 + 110 * c) * t * (1 + t)) * 0.3 + rng.standard_normal(n) * 0.05 for c in range(channels)
    ]
    return (np.stack(waves, axis=1) * 32767).astype(np.int16)


def wav(samples: np.ndarray, rate: int) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(samples.shape[1])
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(samples.astype("<i2").tobytes())
    return buffer.getvalue()


def encoded(samples: np.ndarray, rate: int, container: str, codec: str) -> bytes:
    """``samples`` through FFmpeg's ``codec`` in ``container`` (flac: lossless, the same samples back)."""
    buffer = io.BytesIO()
    layout = "mono" if samples.shape[1] == 1 else "stereo"
    with av.open(buffer, "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate, layout=layout)
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples.reshape(1, -1)), format="s16", layout=layout)
        frame.sample_rate = rate
        for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buffer.getvalue()


def as_float(samples: np.ndarray) -> np.ndarray:
    """What a decoder hands over for 16-bit PCM: ``x / 32768``, the channels averaged (librosa's to_mono)."""
    values = samples.astype(np.float32) / 32768.0
    return values.mean(axis=1, dtype=np.float32) if values.shape[1] > 1 else values[:, 0]


def audio_data_uri(data: bytes, subtype: str = "wav") -> str:
    return data_uri(data, f"audio/{subtype}")
