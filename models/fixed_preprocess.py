"""Faster paths to the exact ``pixel_values`` of transformers' fixed-resolution processors, on both backends.

``CLIPImageProcessorPil`` and ``SiglipImageProcessorPil`` turn an RGB image into pixel values in
many passes: a converted copy, a channels-first array, a PIL image again for the resize, a crop, a
float64 rescale, a float32 copy, a normalisation through two transposes, then a tensor. Here: the
same PIL resize on the image as decoded, the same crop as a slice of the resized pixels, and one
table lookup per channel into the output array.

Their torchvision counterparts (``CLIPImageProcessor``, ``SiglipImageProcessor``) copy the decoded
image twice (an RGB conversion, an array) and then a third time into channels-first planes, which
torch's uint8 antialiased resize turns back into channels-last and out again: on a 640x480 photo that
round trip costs ~3x the resize itself. Here: the processor's own ``resize`` on a channels-first *view*
of the decoded pixels (the kernel's own layout: one copy fewer each way, the same values), its own
``center_crop``, and the same table lookup, its table filled by the processor's own fused
rescale-and-normalise.

Why the table is exact, and how the path is proven against the processor before it serves (it
returns ``None``, meaning "use transformers", when any probe image differs by a single bit): see
:mod:`models.verified_preprocess`, which the dynamic-resolution path shares.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from PIL import Image
from transformers import CLIPImageProcessorPil, SiglipImageProcessorPil
from transformers.image_processing_backends import PilBackend

from mmencode.models.optional import torchvision_problem
from mmencode.models.verified_preprocess import (
    UnsupportedSettings,
    VerifiedPreprocessor,
    byte_ramp_image,
    effective_settings,
    pil_resample,
    plain_rgb,
    probe_images,
    require_own_steps,
    torchvision_value_table,
    value_table,
)

__all__ = ["FixedResolutionPreprocessor", "TorchvisionFixedResolutionPreprocessor", "probe_images"]

# The steps whose behaviour the fast path reproduces; each must be PilBackend's own.
_REPLICATED_STEPS = dict.fromkeys(
    ("_preprocess", "_preprocess_image_like_inputs", "process_image", "resize", "center_crop"), PilBackend
)
# The same for the torchvision processors (resize and center_crop are called, the rest replaced).
_TORCHVISION_STEPS = (
    "_preprocess", "_preprocess_image_like_inputs", "process_image", "resize", "center_crop", "rescale_and_normalize",
)  # fmt: skip
# The decoded image's array is read-only (Pillow hands its bytes over); torch warns on wrapping it, but
# nothing here writes to it: the resize allocates its output.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", module=__name__)


class FixedResolutionPreprocessor(VerifiedPreprocessor):
    """Resize, centre crop, rescale and normalise as the processor does, in fewer passes."""

    def __init__(self, processor: Any) -> None:
        require_own_steps(processor, (CLIPImageProcessorPil, SiglipImageProcessorPil), _REPLICATED_STEPS)
        settings = effective_settings(processor)
        if settings.get("do_pad"):
            raise UnsupportedSettings("do_pad is set")
        if not settings.get("do_resize"):
            raise UnsupportedSettings("do_resize is false (images keep their own sizes)")
        size = settings["size"]
        self.resample = pil_resample(settings)
        if size.height and size.width and not (size.shortest_edge or size.longest_edge or size.max_height):
            self.fixed_size: tuple[int, int] | None = (int(size.height), int(size.width))
            self.shortest_edge: int | None = None
        elif size.shortest_edge and not (size.longest_edge or size.height or size.width or size.max_height):
            self.fixed_size, self.shortest_edge = None, int(size.shortest_edge)
        else:
            raise UnsupportedSettings(f"size={dict(size)} is not a fixed size or a shortest edge alone")
        self.crop: tuple[int, int] | None = None
        if settings.get("do_center_crop"):
            crop = settings["crop_size"]
            if not (crop and crop.height and crop.width):
                raise UnsupportedSettings(f"crop_size={crop!r} has no height and width")
            self.crop = (int(crop.height), int(crop.width))
        self._lut = value_table(processor, settings)

    def output_size(self, width: int, height: int) -> tuple[int, int]:
        """(height, width) after the resize, as ``get_resize_output_image_size(default_to_square=False)``."""
        if self.fixed_size is not None:
            return self.fixed_size
        assert self.shortest_edge is not None
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = self.shortest_edge, int(self.shortest_edge * long / short)
        return (new_long, new_short) if width <= height else (new_short, new_long)

    def __call__(self, image: Image.Image) -> torch.Tensor | None:
        """``pixel_values`` of shape (1, 3, H, W), or ``None`` for an image to leave to transformers (one
        that is not :func:`~models.verified_preprocess.plain_rgb`)."""
        if not plain_rgb(image):
            return None
        height, width = self.output_size(image.width, image.height)
        resized = image.resize((width, height), resample=self.resample)
        pixels = np.asarray(resized)
        if self.crop is not None:
            pixels = _center_crop(pixels, *self.crop)
        out = np.empty((1, 3, *pixels.shape[:2]), dtype=self._lut.dtype)
        for channel in range(3):
            np.take(self._lut[channel], pixels[:, :, channel], out=out[0, channel])
        return torch.from_numpy(out)

    def outputs(self, image: Image.Image) -> Mapping[str, torch.Tensor] | None:
        pixel_values = self(image)
        return None if pixel_values is None else {"pixel_values": pixel_values}

    def own_probes(self) -> list[Image.Image]:
        # The table probe: already the output size, so the resize leaves it as it is.
        edge = self.shortest_edge or 1
        height, width = self.fixed_size or (edge, edge)
        return [byte_ramp_image(width, height)]


def _center_crop(pixels: np.ndarray, crop_height: int, crop_width: int) -> np.ndarray:
    """transformers' ``center_crop`` on (H, W, C) uint8: a slice, or zero padding around a smaller image."""
    height, width = pixels.shape[:2]
    top = (height - crop_height) // 2
    left = (width - crop_width) // 2
    if top >= 0 and left >= 0:
        return pixels[top : top + crop_height, left : left + crop_width]
    new_height, new_width = max(crop_height, height), max(crop_width, width)
    canvas = np.zeros((new_height, new_width, pixels.shape[2]), dtype=pixels.dtype)
    top_pad = math.ceil((new_height - height) / 2)
    left_pad = math.ceil((new_width - width) / 2)
    canvas[top_pad : top_pad + height, left_pad : left_pad + width] = pixels
    top, left = top + top_pad, left + left_pad
    bottom, right = top + crop_height, left + crop_width
    return canvas[max(0, top) : min(new_height, bottom), max(0, left) : min(new_width, right)]


class TorchvisionFixedResolutionPreprocessor(VerifiedPreprocessor):
    """Resize, centre crop, rescale and normalise as a torchvision processor does, without its copies."""

    def __init__(self, processor: Any) -> None:
        if torchvision_problem() is not None:
            raise UnsupportedSettings("torchvision is not importable")
        from transformers import CLIPImageProcessor, SiglipImageProcessor
        from transformers.image_processing_backends import TorchvisionBackend

        steps = dict.fromkeys(_TORCHVISION_STEPS, TorchvisionBackend)
        require_own_steps(processor, (CLIPImageProcessor, SiglipImageProcessor), steps)
        settings = effective_settings(processor)
        if settings.get("do_pad"):
            raise UnsupportedSettings("do_pad is set")
        if not settings.get("do_resize"):
            raise UnsupportedSettings("do_resize is false (images keep their own sizes)")
        size = settings["size"]
        if size.height and size.width and not (size.shortest_edge or size.longest_edge or size.max_height):
            self._probe_size = (int(size.height), int(size.width))
        elif size.shortest_edge and not (size.longest_edge or size.height or size.width or size.max_height):
            self._probe_size = (int(size.shortest_edge), int(size.shortest_edge))
        else:
            raise UnsupportedSettings(f"size={dict(size)} is not a fixed size or a shortest edge alone")
        crop = settings["crop_size"] if settings.get("do_center_crop") else None
        if settings.get("do_center_crop") and not (crop and crop.height and crop.width):
            raise UnsupportedSettings(f"crop_size={crop!r} has no height and width")
        self._processor, self._size, self._resample, self._crop = processor, size, settings.get("resample"), crop
        self._lut = torchvision_value_table(processor, settings)

    def __call__(self, image: Image.Image) -> torch.Tensor | None:
        """``pixel_values`` of shape (1, 3, H, W), or ``None`` for an image to leave to transformers
        (one with transparency, as for the PIL path)."""
        if not plain_rgb(image):
            return None
        planes = torch.from_numpy(np.asarray(image)).permute(2, 0, 1)  # a view: channels-last in memory
        resized = self._processor.resize(image=planes, size=self._size, resample=self._resample)
        if self._crop is not None:
            resized = self._processor.center_crop(resized, self._crop)
        pixels = resized.numpy()
        out = np.empty((1, *pixels.shape), dtype=self._lut.dtype)
        for channel in range(3):
            np.take(self._lut[channel], pixels[channel], out=out[0, channel])
        return torch.from_numpy(out)

    def outputs(self, image: Image.Image) -> Mapping[str, torch.Tensor] | None:
        pixel_values = self(image)
        return None if pixel_values is None else {"pixel_values": pixel_values}

    def own_probes(self) -> list[Image.Image]:
        height, width = self._probe_size  # the resize leaves an image of its output size as it is
        return [byte_ramp_image(width, height)]
