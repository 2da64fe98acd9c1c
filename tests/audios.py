"""Audio files for the tests, written by the standard library (wav) and PyAV (flac, ogg, mp3)."""

from __future__ import annotations

import io
import wave

import av
import numpy as np

from tests import support


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
    return support.data_uri(data, f"audio/{subtype}")
