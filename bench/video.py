"""Video decoding and preprocessing: what a 720p clip costs before the tower, and what it holds in memory.

Clips of 10 s and 60 s, 1280x720 at 30 fps, H.264 (made here with PyAV). For Qwen2-VL and Qwen3-VL
servable checkpoints, whose video processor settings are transformers' defaults (those of
Qwen2-VL-7B-Instruct and the Qwen3-VL releases; the tiny tower does not matter here), each clip at the
checkpoint's own sampling, at ``fps=2`` and at SGLang's (``sampling: sglang``):

- ``decode s``: mmencode's decode_video (packet count, then one decoding pass converting only the
  frames the processor keeps), and the frames it holds;
- ``all frames s``: decoding and converting every frame, as a loader that samples afterwards does, and
  what those frames would hold;
- ``preprocess s`` and ``rows``: the video processor on the kept frames, and the rows the tower yields.

A clip over the limits (``--max-video-frames`` 768 kept, ``--max-video-tokens`` 32768 rows) is
reported with the limit it meets, as the service would answer 413.

    .venv/bin/python -m bench.video [--seconds 10 60] [--families qwen2_vl qwen3_vl]
"""

from __future__ import annotations

import argparse
import functools
import io
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import torch

from mmencode.app.engine.errors import PayloadTooLarge
from mmencode.app.media.video import VideoLimits, decode_video
from mmencode.app.peers.sglang.sampling import SGLANG_FRAMES
from mmencode.models.base import VideoSampling
from mmencode.models.registry import load_encoder
from mmencode.models.tiny import build_tiny

LIMITS = VideoLimits(max_seconds=600, max_frames=768, max_frame_pixels=40_000_000, max_decoded_bytes=2048 * 2**20)
MAX_ROWS = 32768


def make_clip(seconds: int, width: int = 1280, height: int = 720, fps: int = 30) -> bytes:
    """A moving gradient with noise, so that every frame differs and the codec works for it."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    noise = rng.normal(0, 3, (16, height, width, 1)).astype(np.float32)
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as output:
        stream = output.add_stream("libx264", rate=Fraction(fps))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "veryfast", "crf": "28"}
        for i in range(seconds * fps):
            base = np.sin((x + 5 * i) / 40.0) * 70 + np.cos((y - 3 * i) / 30.0) * 50 + 128
            pixels = np.clip(base[..., None] + noise[i % 16] + np.array([0, 25, -25]), 0, 255).astype(np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                output.mux(packet)
        for packet in stream.encode():
            output.mux(packet)
    return buffer.getvalue()


def every_frame(data: bytes) -> tuple[float, int, int]:
    """Seconds to decode and convert every frame; their count and bytes."""
    start = time.perf_counter()
    frames = held = 0
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        for frame in container.decode(stream):
            held += frame.to_ndarray(format="rgb24").nbytes
            frames += 1
    return time.perf_counter() - start, frames, held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, nargs="+", default=[10, 60])
    parser.add_argument("--families", nargs="+", default=["qwen2_vl", "qwen3_vl"])
    args = parser.parse_args()
    torch.set_num_threads(2)
    clips = {seconds: make_clip(seconds) for seconds in args.seconds}
    baseline = {seconds: every_frame(data) for seconds, data in clips.items()}
    print(
        "| family | clip | sampling | frames kept | held MB | decode s | all frames s | all frames MB | "
        "preprocess s | rows |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as root:
        for family in args.families:
            adapter = load_encoder(
                build_tiny(Path(root) / family, family, layout="servable"),
                device=torch.device("cpu"),
                dtype=torch.float32,
            )
            for seconds, data in clips.items():
                all_s, all_frames, all_bytes = baseline[seconds]
                samplings = (
                    ("checkpoint", VideoSampling()),
                    ("fps=2", VideoSampling(fps=2.0)),
                    ("sglang", VideoSampling(choice=SGLANG_FRAMES)),
                )
                for label, sampling in samplings:
                    row = f"| {family} | {seconds} s 720p30 ({len(data) / 2**20:.1f} MB) | {label} |"
                    tail = f" {all_s:.2f} | {all_bytes / 2**20:.0f} ({all_frames} frames) |"
                    keep = functools.partial(adapter.video_frames_to_keep, sampling=sampling)
                    start = time.perf_counter()
                    try:
                        video = decode_video(data, LIMITS, keep)
                    except PayloadTooLarge as exc:
                        print(f"{row} 413: {exc.details.get('limit')} | - | - |{tail} - | - |")
                        continue
                    decode_s = time.perf_counter() - start
                    start = time.perf_counter()
                    prepared = adapter.preprocess_video(video, sampling)
                    preprocess_s = time.perf_counter() - start
                    rows = f"{prepared.num_tokens}" + (" (over 32768: 413)" if prepared.num_tokens > MAX_ROWS else "")
                    print(
                        f"{row} {len(video.indices)} | {video.frames.nbytes / 2**20:.0f} | {decode_s:.2f} |{tail}"
                        f" {preprocess_s:.2f} | {rows} |"
                    )


if __name__ == "__main__":
    main()
