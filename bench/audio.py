"""Audio decoding and feature extraction: what a clip costs before the tower, per format and rate.

Clips of 10 s and 30 s (the Whisper window), a chirp under noise, as 16-bit PCM wav, flac and mp3, at
16 kHz mono (no resampling) and 44.1 kHz stereo (averaged, then resampled to 16 kHz with soxr HQ). For
the tiny checkpoint of each audio family (``--families``; the feature extractor is the real model's: 128
mel bins; Qwen2-Audio and Qwen2.5-Omni pad to the 30 s window, Qwen3-Omni takes the clip's own length):

- ``decode ms``: mmencode's decode_audio (PyAV, FFmpeg's float conversion, mono, soxr);
- ``features ms``: the checkpoint's WhisperFeatureExtractor as the family's processor calls it (the
  whole 30 s window, padded, with its mask);
- ``rows``: the placeholders (and rows) the clip yields.

Each figure is the fastest of ``--repeats`` runs, on one thread as the service's pool runs it.

    .venv/bin/python -m bench.audio [--seconds 10 30] [--repeats 5] [--families qwen2_audio ...]
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import av
import numpy as np
import torch

from mmencode.app.engine.threads import torch_threads_here
from mmencode.app.media.audio import AudioLimits, decode_audio
from mmencode.models.registry import load_encoder
from mmencode.models.tiny import build_tiny

FAMILIES = ("qwen2_audio", "qwen2_5_omni", "qwen3_omni_moe")
COLUMNS = ["family", "format", "rate", "channels", "seconds", "file KB", "decode ms", "features ms", "rows"]


def clip_samples(seconds: float, rate: int, channels: int) -> np.ndarray:
    """``(samples, channels)`` int16: a chirp under noise, different in every channel."""
    rng = np.random.default_rng(0)
    t = np.arange(round(seconds * rate)) / rate
    waves = [
        np.sin(2 * np.pi * (220 + 110 * c) * t * (1 + t / 10)) * 0.3 + rng.normal(0, 0.05, len(t))
        for c in range(channels)
    ]
    return (np.stack(waves, axis=1) * 32767).astype(np.int16)


def audio_file(samples: np.ndarray, rate: int, container: str) -> bytes:
    codec = {"wav": "pcm_s16le", "flac": "flac", "mp3": "libmp3lame"}[container]
    layout = "mono" if samples.shape[1] == 1 else "stereo"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"clip.{container}"
        with av.open(str(path), "w") as out:
            stream = out.add_stream(codec, rate=rate, layout=layout)
            frame_size = 1152 if container == "mp3" else 4096
            for start in range(0, len(samples), frame_size):
                chunk = np.ascontiguousarray(samples[start : start + frame_size].reshape(1, -1))
                frame = av.AudioFrame.from_ndarray(chunk, format="s16", layout=layout)
                frame.sample_rate = rate
                for packet in stream.encode(frame):
                    out.mux(packet)
            for packet in stream.encode(None):
                out.mux(packet)
        return path.read_bytes()


def fastest(call: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, nargs="+", default=[10.0, 30.0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    args = parser.parse_args()
    torch_threads_here(1)
    limits = AudioLimits(max_seconds=max(args.seconds))
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + " --- |" * len(COLUMNS))
    for family in args.families:
        with tempfile.TemporaryDirectory() as tmp:
            adapter = load_encoder(
                build_tiny(Path(tmp) / family, family), device=torch.device("cpu"), dtype=torch.float32
            )
        rate_out = adapter.audio_sampling_rate
        assert rate_out is not None
        for seconds in args.seconds:
            for rate, channels in ((16_000, 1), (44_100, 2)):
                samples = clip_samples(seconds, rate, channels)
                for container in ("wav", "flac", "mp3"):
                    data = audio_file(samples, rate, container)
                    audio = decode_audio(data, limits, rate_out)
                    decode = fastest(functools.partial(decode_audio, data, limits, rate_out), args.repeats)
                    prepared = adapter.preprocess_audio(audio)
                    features = fastest(functools.partial(adapter.preprocess_audio, audio), args.repeats)
                    cells = [family, container, rate, channels, f"{seconds:g}", len(data) // 1024]
                    cells += [f"{decode * 1000:.1f}", f"{features * 1000:.1f}", prepared.num_tokens]
                    print("| " + " | ".join(str(cell) for cell in cells) + " |", flush=True)


if __name__ == "__main__":
    main()
