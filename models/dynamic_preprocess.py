"""A faster path to the exact outputs of transformers' Qwen2-VL PIL image processor.

``Qwen2VLImageProcessorPil`` (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5) resizes each image to a size
``smart_resize`` picks (multiples of ``patch_size * merge_size``, pixels within ``size``'s
``shortest_edge`` and ``longest_edge``), then rescales it in float64, normalises it in float32 through
two transposes, and cuts it into patches: a float32 transpose of the whole image and a copy per
temporal patch. Here: transformers' own ``smart_resize`` and the same PIL resize, the uint8 pixels put
in patch order (a quarter of the bytes to move), one table lookup per channel, and one copy into the
output rows that also makes the temporal copies.

Its torchvision counterpart (``Qwen2VLImageProcessor``, the default wherever torchvision imports) copies
the decoded image into channels-first planes, resizes them with torch's uint8 antialiased kernel (which
works channels-last and turns them back), rescales and normalises the whole image in float32 and then
patchifies it as the PIL one does. Here: the processor's own ``resize`` on a channels-first *view* of the
decoded pixels, then the same patch order and table lookup as above, the table filled by the
processor's own fused rescale-and-normalise.

The table is exact for the reason :mod:`models.verified_preprocess` gives, and a path serves only
after it matched the processor bit for bit on probe images, these settings' own among them (one
below min_pixels, one past max_pixels, one holding every byte at a size the resize keeps); otherwise
:meth:`~VerifiedPreprocessor.verified` returns ``None`` and transformers' processor serves.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import torch
from PIL import Image
from transformers import Qwen2VLImageProcessorPil
from transformers.image_processing_backends import PilBackend
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

from mmencode.models.optional import torchvision_problem
from mmencode.models.verified_preprocess import (
    UnsupportedSettings,
    VerifiedPreprocessor,
    byte_ramp_image,
    effective_settings,
    noise_probe,
    pil_resample,
    plain_rgb,
    require_own_steps,
    torchvision_value_table,
    value_table,
)

__all__ = ["DynamicResolutionPreprocessor", "TorchvisionDynamicResolutionPreprocessor"]

# The steps whose behaviour the fast path reproduces: the Qwen2-VL class's own resize and patches, and
# PilBackend's way from an input image to the channels-first array they receive.
_REPLICATED_STEPS: dict[str, type] = {
    **dict.fromkeys(
        ("preprocess", "_standardize_kwargs", "_preprocess", "resize", "patchify"), Qwen2VLImageProcessorPil
    ),
    **dict.fromkeys(
        ("_preprocess_image_like_inputs", "_prepare_image_like_inputs", "process_image", "rescale", "normalize"),
        PilBackend,
    ),
}
# The same for the torchvision processor (its class's resize called, the rest replaced); its resize calls
# TorchvisionBackend's, which only the exact class guarantees.
_TORCHVISION_CLASS_STEPS = ("preprocess", "_standardize_kwargs", "_preprocess", "resize", "patchify")
_TORCHVISION_BACKEND_STEPS = (
    "_preprocess_image_like_inputs", "_prepare_image_like_inputs", "process_image", "rescale_and_normalize",
)  # fmt: skip
# The decoded image's array is read-only (Pillow hands its bytes over); torch warns on wrapping it, but
# nothing here writes to it: the resize allocates its output.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", module=__name__)
# A probe past max_pixels costs the processor about as long as a real image that size (a 4096x4096
# image: seconds at load). Above this many pixels the downscaling probe is left out: that branch only
# changes the size transformers' own smart_resize returns, and the other probes cover the PIL resize.
_DOWNSCALE_PROBE_MAX_PIXELS = 2**21


class DynamicResolutionPreprocessor(VerifiedPreprocessor):
    """``smart_resize``, rescale, normalise and patchify as the Qwen2-VL processor does, in fewer passes."""

    def __init__(self, processor: Any) -> None:
        require_own_steps(processor, (Qwen2VLImageProcessorPil,), _REPLICATED_STEPS)
        settings = effective_settings(processor)
        self._read_grid(settings)
        self.resample = pil_resample(settings)
        # float32 as patchify casts whatever rescale/normalize return (uint8 when both are off).
        self._lut = np.asarray(value_table(processor, settings), dtype=np.float32)

    def _read_grid(self, settings: dict[str, Any]) -> None:
        """The resize's pixel bounds and the patch grid, from settings both backends name alike."""
        if not settings.get("do_resize"):
            raise UnsupportedSettings("do_resize is false (images keep their own sizes)")
        size = settings["size"]
        if not (size and size.shortest_edge and size.longest_edge):
            raise UnsupportedSettings(
                f"size={dict(size or {})} has no shortest_edge and longest_edge (min and max pixels)"
            )
        self.min_pixels, self.max_pixels = int(size.shortest_edge), int(size.longest_edge)
        grid = {name: settings.get(name) for name in ("patch_size", "merge_size", "temporal_patch_size")}
        if not all(isinstance(value, int) and value > 0 for value in grid.values()):
            raise UnsupportedSettings(f"patch settings {grid} are not positive integers")
        self.patch_size, self.merge_size = int(settings["patch_size"]), int(settings["merge_size"])
        self.temporal_patch_size = int(settings["temporal_patch_size"])
        self.factor = self.patch_size * self.merge_size
        self._table_probe_side = self._unchanged_square_side()

    def output_size(self, width: int, height: int) -> tuple[int, int]:
        """(height, width) after the resize: transformers' ``smart_resize``, its ValueError included
        (an aspect ratio over 200), so such an image fails here as it does in the processor."""
        return smart_resize(height, width, factor=self.factor, min_pixels=self.min_pixels, max_pixels=self.max_pixels)

    def __call__(self, image: Image.Image) -> dict[str, torch.Tensor] | None:
        """``pixel_values`` (patches, C*T*P*P) and ``image_grid_thw`` [[1, h, w]], or ``None`` for an
        image to leave to transformers (one that is not :func:`~models.verified_preprocess.plain_rgb`)."""
        if not plain_rgb(image):
            return None
        height, width = self.output_size(image.width, image.height)
        # PilBackend resizes even to the same size (PIL then copies): the same call either way.
        pixels = np.asarray(image.resize((width, height), resample=self.resample))
        patch, merge = self.patch_size, self.merge_size
        # patchify's order, (gh/m, gw/m, m, m, C, P, P), taken from (H, W, C) while still one byte a value,
        # with the channel first so that each channel's lookups write one contiguous run: into a strided
        # output np.take buffers every write, ~2x slower over a whole image.
        blocks = pixels.reshape(height // self.factor, merge, patch, width // self.factor, merge, patch, 3)
        return self._patch_rows(blocks.transpose(6, 0, 3, 1, 4, 2, 5), height, width)

    def _patch_rows(self, by_channel: np.ndarray, height: int, width: int) -> dict[str, torch.Tensor]:
        """The outputs from resized bytes in patch order, channel first: (C, gh/m, gw/m, m, m, P, P)."""
        patch, temporal = self.patch_size, self.temporal_patch_size
        by_channel = np.ascontiguousarray(by_channel).reshape(3, -1, patch, patch)
        values = np.empty(by_channel.shape, dtype=self._lut.dtype)
        for channel in range(3):
            # mode="clip" skips the bounds check's buffering; a uint8 index is always inside the 256 entries.
            np.take(self._lut[channel], by_channel[channel], out=values[channel], mode="clip")
        count = by_channel.shape[1]
        out = np.empty((count, 3, temporal, patch, patch), dtype=self._lut.dtype)
        # One copy puts the channel after the patch and repeats the still image over the temporal patch.
        out[...] = values.transpose(1, 0, 2, 3)[:, :, None]
        return {
            "pixel_values": torch.from_numpy(out.reshape(count, -1)),
            "image_grid_thw": torch.tensor([[1, height // patch, width // patch]], dtype=torch.int64),
        }

    def outputs(self, image: Image.Image) -> dict[str, torch.Tensor] | None:
        return self(image)

    def own_probes(self) -> list[Image.Image]:
        rng = np.random.default_rng(28)
        side = self._table_probe_side
        probes = [byte_ramp_image(side, side)]
        # Below min_pixels: smart_resize scales up.
        small = max(1, math.isqrt(self.min_pixels) // 2)
        probes.append(noise_probe(small, max(1, small * 2 // 3), rng))
        # Past max_pixels: smart_resize scales down (within the probe budget, see above).
        if self.max_pixels <= _DOWNSCALE_PROBE_MAX_PIXELS:
            width = math.isqrt(self.max_pixels * 5 // 3) + 1  # 4:3, a quarter more pixels than max_pixels
            probes.append(noise_probe(width, width * 3 // 4 + 1, rng))
        return probes

    def _unchanged_square_side(self) -> int:
        """The smallest square the resize leaves as it is with room for all 256 bytes: the table probe."""
        for multiple in range(1, math.isqrt(max(self.max_pixels, 256)) // self.factor + 2):
            side = multiple * self.factor
            if side * side >= 256 and self.output_size(side, side) == (side, side):
                return side
        raise UnsupportedSettings(
            f"no square image the resize leaves unchanged (min_pixels={self.min_pixels}, max_pixels={self.max_pixels})"
        )


class TorchvisionDynamicResolutionPreprocessor(DynamicResolutionPreprocessor):
    """The same for the torchvision processor: its own resize on a view of the decoded pixels, no float image."""

    def __init__(self, processor: Any) -> None:
        if torchvision_problem() is not None:
            raise UnsupportedSettings("torchvision is not importable")
        from transformers import Qwen2VLImageProcessor
        from transformers.image_processing_backends import TorchvisionBackend

        steps: dict[str, type] = {
            **dict.fromkeys(_TORCHVISION_CLASS_STEPS, Qwen2VLImageProcessor),
            **dict.fromkeys(_TORCHVISION_BACKEND_STEPS, TorchvisionBackend),
        }
        require_own_steps(processor, (Qwen2VLImageProcessor,), steps)
        settings = effective_settings(processor)
        self._read_grid(settings)
        self._processor, self._size, self._resample = processor, settings["size"], settings.get("resample")
        # In the dtype rescale_and_normalize gives (float32; uint8 with both steps off): patchify keeps it.
        self._lut = torchvision_value_table(processor, settings)

    def __call__(self, image: Image.Image) -> dict[str, torch.Tensor] | None:
        """As :meth:`DynamicResolutionPreprocessor.__call__`."""
        if not plain_rgb(image):
            return None
        planes = torch.from_numpy(np.asarray(image)).permute(2, 0, 1)  # a view: channels-last in memory
        # The processor's own resize: its smart_resize, then the same kernel call, even to the same size.
        resized = self._processor.resize(planes, size=self._size, resample=self._resample, factor=self.factor)
        _, height, width = resized.shape
        patch, merge = self.patch_size, self.merge_size
        pixels = resized.numpy()  # (C, H, W), whatever the kernel's strides
        blocks = pixels.reshape(3, height // self.factor, merge, patch, width // self.factor, merge, patch)
        return self._patch_rows(blocks.transpose(0, 1, 4, 2, 5, 3, 6), height, width)
