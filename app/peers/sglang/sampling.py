"""SGLang's own sampling of a Qwen clip: which frames, and at what size they reach the video processor.

SGLang 0.5.23 decodes a clip itself with qwen-vl-utils' rules (``preprocess_video`` in
``sglang/srt/multimodal/processors/qwen_vl.py``, which its encoder server runs too) before the checkpoint's
video processor, called with ``do_sample_frames=False``:

- the frame count: the clip's length at 2 frames a second (or the ``fps`` asked for), at least 4, at most
  768 and the clip's own, *floored* to an even number; or ``nframes`` rounded to an even number;
- the frames: ``linspace(0, total - 1, count)`` truncated to integers (not rounded, as transformers
  does), repeats dropped;
- the size: every frame resized with torchvision's antialiased bilinear to multiples of 28, between
  128 and 768 tiles of 28x28 pixels and within a budget for the whole clip (``VIDEO_TOTAL_PIXELS``:
  90 % of 128,000 tiles, shared by its frames two at a time).

The same rules here, on the frames PyAV decodes; ``tests/peers/test_sglang_video_sampling.py`` checks them
against SGLang's own function. The constants are SGLang's defaults (its ``--mm-process-config`` video
settings other than ``fps`` and ``nframes`` are not read here).

:data:`SGLANG_FRAMES` hands these rules to the Qwen adapters as a ``models.base.FrameChoice``: the
models name no peer; the composition root (app/server.py) gives the engine this choice for the
``sglang`` sampling rule.
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = [
    "SGLANG_FPS",
    "SGLANG_FRAMES",
    "SGLangFrames",
    "sglang_frame_indices",
    "sglang_frame_size",
    "sglang_resize_frames",
]

SGLANG_FPS = 2.0  # frames a second where none is asked for; also what SGLang's Qwen2.5-VL timing assumes
_FRAME_FACTOR = 2
_MIN_FRAMES = 4
_MAX_FRAMES = 768
_SIZE_FACTOR = 28  # SGLang passes qwen-vl-utils' image factor for every Qwen model, Qwen3-VL's included
_MIN_PIXELS = 128 * 28 * 28
_MAX_PIXELS = 768 * 28 * 28
_TOTAL_PIXELS = int(128000 * 28 * 28 * 0.9)
_MAX_RATIO = 200


def sglang_frame_indices(
    total_frames: int, clip_fps: float, *, fps: float | None = None, num_frames: int | None = None
) -> list[int]:
    """The clip's frames SGLang keeps; ``ValueError`` where SGLang refuses the clip (fewer than 2 frames
    to keep)."""
    if num_frames is not None:
        count: float = round(num_frames / _FRAME_FACTOR) * _FRAME_FACTOR
    else:
        # More frames a second than the clip has is only a warning in SGLang: the clip's own frames.
        wanted = total_frames / clip_fps * (fps if fps is not None else SGLANG_FPS)
        low = math.ceil(_MIN_FRAMES / _FRAME_FACTOR) * _FRAME_FACTOR
        high = math.floor(min(_MAX_FRAMES, total_frames) / _FRAME_FACTOR) * _FRAME_FACTOR
        count = math.floor(min(max(wanted, low), high, total_frames) / _FRAME_FACTOR) * _FRAME_FACTOR
    if not _FRAME_FACTOR <= count <= total_frames:
        raise ValueError(f"SGLang samples between {_FRAME_FACTOR} and the clip's {total_frames} frames, not {count:g}")
    indices = np.unique(np.linspace(0, total_frames - 1, num=int(count), dtype=np.int64))
    return [int(i) for i in indices]


def sglang_frame_size(frames: int, height: int, width: int) -> tuple[int, int]:
    """``(height, width)`` SGLang resizes each of a clip's ``frames`` to (qwen-vl-utils' ``smart_resize``)."""
    if max(height, width) / min(height, width) > _MAX_RATIO:
        raise ValueError(f"an aspect ratio over {_MAX_RATIO} ({width}x{height})")
    max_pixels = max(min(_MAX_PIXELS, _TOTAL_PIXELS / frames * _FRAME_FACTOR), int(_MIN_PIXELS * 1.05))
    h_bar = max(_SIZE_FACTOR, round(height / _SIZE_FACTOR) * _SIZE_FACTOR)
    w_bar = max(_SIZE_FACTOR, round(width / _SIZE_FACTOR) * _SIZE_FACTOR)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = math.floor(height / beta / _SIZE_FACTOR) * _SIZE_FACTOR
        w_bar = math.floor(width / beta / _SIZE_FACTOR) * _SIZE_FACTOR
    elif h_bar * w_bar < _MIN_PIXELS:
        beta = math.sqrt(_MIN_PIXELS / (height * width))
        h_bar = math.ceil(height * beta / _SIZE_FACTOR) * _SIZE_FACTOR
        w_bar = math.ceil(width * beta / _SIZE_FACTOR) * _SIZE_FACTOR
    return h_bar, w_bar


def sglang_resize_frames(frames: np.ndarray) -> torch.Tensor:
    """``(kept, height, width, 3)`` uint8 frames as SGLang hands them to the video processor: a
    ``(kept, 3, h, w)`` uint8 tensor, resized as :func:`sglang_frame_size` says."""
    # Imported here: video processors need torchvision anyway, and a server without it serves images.
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.functional import resize

    video = torch.from_numpy(frames).permute(0, 3, 1, 2)  # a channels-last view, as SGLang's decoder gives
    size = sglang_frame_size(video.shape[0], video.shape[2], video.shape[3])
    return resize(video, list(size), interpolation=InterpolationMode.BILINEAR)


class SGLangFrames:
    """SGLang's frame choice and frame size, as a ``models.base.FrameChoice``."""

    name = "sglang"
    default_fps = SGLANG_FPS

    def frame_indices(
        self, total_frames: int, clip_fps: float, *, fps: float | None, num_frames: int | None
    ) -> list[int]:
        return sglang_frame_indices(total_frames, clip_fps, fps=fps, num_frames=num_frames)

    def resize(self, frames: np.ndarray) -> torch.Tensor:
        return sglang_resize_frames(frames)


SGLANG_FRAMES = SGLangFrames()
