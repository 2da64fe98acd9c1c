"""SGLang's own video sampling, ``preprocess_video`` of sglang 0.5.23, on frames the test hands over.

Run with the vLLM oracle's Python (.venv-vllm: torch 2.13 with its torchvision shim and transformers 5.19,
SGLang 0.5.23's own pin, and every package SGLang's processor module imports) with the peers venv's
site-packages, where sglang is installed, appended to the path: the peers venv has no torchvision, which
this SGLang code needs. ``preprocess_video`` runs as SGLang's language server and encoder server run it
before the checkpoint's video processor: it picks the frames, reads them from the decoder and resizes them.

The decoder is SGLang's ``VideoDecoderWrapper`` (torchcodec or decord, neither on this machine) with the
frames the test decoded with PyAV: what is checked is SGLang's sampling and resizing, on the same pixels.

Reads CASES (``torch.save``: a list of ``{"frames": (n, h, w, 3) uint8, "fps": float, "config": dict}``,
``config`` SGLang's ``video`` settings, ``{}`` for its defaults; ``"merge_size"`` the checkpoint's, 2 when
absent) and writes to OUT, per case,
``{"video": (kept, 3, h, w) uint8, "indices": [...], "timestamps": [...]}`` (the Qwen3-VL per-patch times
of SGLang's encoder, ``EncoderPreprocessor._calculate_timestamps``) or ``{"error": message}``.

usage: python sglang_video.py PEERS_SITE_PACKAGES CASES OUT
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

sys.path.append(sys.argv[1])

import numpy as np
import torch
from sglang.srt.disaggregation.encoder.preprocessor import EncoderPreprocessor
from sglang.srt.multimodal.processors.qwen_vl import preprocess_video
from sglang.srt.utils import common
from sglang.srt.utils.video_decoder import VideoDecoderWrapper

# SGLang's CPU engine (SGLANG_USE_CPU_ENGINE=1) keeps frames out of pinned memory, which needs a GPU. Set
# after the imports: at import time the flag switches SGLang's modules to sgl_kernel's CPU build.
os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
common.is_cpu.cache_clear()


class DecodedFrames(VideoDecoderWrapper):
    """SGLang's decoder interface over frames already decoded (by PyAV, in the test)."""

    def __init__(self, frames: np.ndarray, fps: float) -> None:  # no file to open
        self._frames, self._fps = frames, fps

    def __len__(self) -> int:
        return len(self._frames)

    @property
    def avg_fps(self) -> float:
        return self._fps

    def get_frames_as_tensor(self, indices: list[int]) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(self._frames[indices]))  # NHWC, as SGLang's decoders

    def close(self) -> None:
        pass

    def __del__(self) -> None:
        pass


def run(case: dict[str, Any]) -> dict[str, Any]:
    frames = case["frames"].numpy()
    try:
        video, metadata = asyncio.run(preprocess_video(DecodedFrames(frames, case["fps"]), video_config=case["config"]))
    except ValueError as exc:
        return {"error": str(exc)}
    indices = [int(i) for i in metadata["frames_indices"]]
    merge_size = case.get("merge_size", 2)  # the checkpoint's spatial_merge_size, which SGLang's encoder reads
    timestamps = EncoderPreprocessor._calculate_timestamps(None, list(indices), metadata["fps"], merge_size)  # type: ignore[arg-type]
    return {"video": video.contiguous(), "indices": indices, "timestamps": [float(t) for t in timestamps]}


def main() -> None:
    cases = torch.load(sys.argv[2], weights_only=True)
    torch.save([run(case) for case in cases], sys.argv[3])


if __name__ == "__main__":
    main()
