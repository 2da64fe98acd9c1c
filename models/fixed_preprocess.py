"""A faster path to the exact ``pixel_values`` of transformers' fixed-resolution PIL processors.

``CLIPImageProcessorPil`` and ``SiglipImageProcessorPil`` turn an RGB image into pixel values in
many passes: a converted copy, a channels-first array, a PIL image again for the resize, a crop, a
float64 rescale, a float32 copy, a normalisation through two transposes, then a tensor. Here: the
same PIL resize on the image as decoded, the same crop as a slice of the resized pixels, and one
table lookup per channel into the output array.

Why a table is exact: after the resize every value is a uint8, and rescale and normalise act on each
value alone (``float32(float64(x) * scale)``, then ``(x - mean) / std`` in float32). So the output is a
function of (channel, byte) with 3 x 256 entries, and the table is filled by running the processor's
*own* ``rescale`` and ``normalize`` on a ramp of the 256 bytes: whatever they compute, the table holds.

Nothing here is trusted on its reasoning alone: :meth:`FixedResolutionPreprocessor.verified` builds
the fast path only for settings it replicates, then compares it with the processor on probe images
(sizes, aspect ratios, images smaller than the crop, greyscale made RGB) and returns ``None``, meaning
"use transformers", when any probe differs by a single bit.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image
from transformers import CLIPImageProcessorPil, SiglipImageProcessorPil
from transformers.image_processing_backends import PilBackend

__all__ = ["FixedResolutionPreprocessor", "probe_images"]

logger = logging.getLogger(__name__)

# Exactly these classes: a subclass may override any step.
_SUPPORTED_CLASSES = (CLIPImageProcessorPil, SiglipImageProcessorPil)
# The steps whose behaviour the fast path reproduces; each must be PilBackend's own.
_REPLICATED_METHODS = ("_preprocess", "_preprocess_image_like_inputs", "process_image", "resize", "center_crop")
_PIL_FILTERS = frozenset(
    int(f)
    for f in (
        Image.Resampling.NEAREST,
        Image.Resampling.BOX,
        Image.Resampling.BILINEAR,
        Image.Resampling.HAMMING,
        Image.Resampling.BICUBIC,
        Image.Resampling.LANCZOS,
    )
)


class UnsupportedSettings(Exception):
    """The processor's settings are outside what the fast path reproduces."""


class FixedResolutionPreprocessor:
    """Resize, centre crop, rescale and normalise as the processor does, in fewer passes."""

    def __init__(self, processor: Any) -> None:
        settings = _effective_settings(processor)
        if type(processor) not in _SUPPORTED_CLASSES:
            raise UnsupportedSettings(f"{type(processor).__name__} is not one of the replicated processors")
        for name in _REPLICATED_METHODS:
            if getattr(type(processor), name) is not getattr(PilBackend, name):
                raise UnsupportedSettings(f"{type(processor).__name__} overrides {name}")
        if settings.get("do_pad"):
            raise UnsupportedSettings("do_pad is set")
        if not settings.get("do_resize"):
            raise UnsupportedSettings("do_resize is false (images keep their own sizes)")
        size = settings["size"]
        resample = settings.get("resample")
        resample = int(Image.Resampling.BILINEAR) if resample is None else resample  # PilBackend.resize's default
        if not isinstance(resample, int) or int(resample) not in _PIL_FILTERS:
            raise UnsupportedSettings(f"resample={resample!r} is not a PIL filter")
        self.resample = int(resample)
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
        self._lut = _value_table(processor, settings)

    @classmethod
    def verified(
        cls, processor: Any, probes: Sequence[Image.Image] | None = None, *, label: str = ""
    ) -> FixedResolutionPreprocessor | None:
        """The fast path if it matches ``processor`` bit for bit on every probe image, else ``None``."""
        name = label or type(processor).__name__
        try:
            fast = cls(processor)
        except UnsupportedSettings as exc:
            logger.info("%s: preprocessing with transformers' processor (no fast path: %s)", name, exc)
            return None
        reference = _reference(processor)
        probes = [*(probe_images() if probes is None else probes), _table_probe(fast)]
        for probe in probes:
            expected = reference(probe)
            got = fast(probe)
            if got is None or got.dtype != expected.dtype or not torch.equal(got, expected):
                logger.warning(
                    "%s: the fast preprocessing path differs from transformers' on a %dx%d probe image; "
                    "preprocessing with transformers' processor",
                    name,
                    *probe.size,
                )
                return None
        logger.info("%s: fast preprocessing, bit-identical to transformers' on %d probe images", name, len(probes))
        return fast

    def output_size(self, width: int, height: int) -> tuple[int, int]:
        """(height, width) after the resize, as ``get_resize_output_image_size(default_to_square=False)``."""
        if self.fixed_size is not None:
            return self.fixed_size
        assert self.shortest_edge is not None
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = self.shortest_edge, int(self.shortest_edge * long / short)
        return (new_long, new_short) if width <= height else (new_short, new_long)

    def __call__(self, image: Image.Image) -> torch.Tensor | None:
        """``pixel_values`` of shape (1, 3, H, W), or ``None`` for an image to leave to transformers.

        transformers composites an image with transparency over white, even an RGB one that only
        names a transparent colour: such images take the reference path.
        """
        if image.mode != "RGB" or image.info.get("transparency") is not None:
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


def _effective_settings(processor: Any) -> dict[str, Any]:
    """The keyword arguments ``preprocess`` resolves from the processor's attributes when none are passed."""
    kwargs = {name: getattr(processor, name, None) for name in processor._valid_kwargs_names}
    return dict(processor._standardize_kwargs(**kwargs))


def _value_table(processor: Any, settings: dict[str, Any]) -> np.ndarray:
    """(3, 256): the processor's own rescale and normalise applied to every byte of every channel."""
    ramp = np.broadcast_to(np.arange(256, dtype=np.uint8), (3, 1, 256)).copy()  # channels first, as _preprocess
    values: np.ndarray = ramp
    if settings.get("do_rescale"):
        values = processor.rescale(values, settings["rescale_factor"])
    if settings.get("do_normalize"):
        values = processor.normalize(values, settings["image_mean"], settings["image_std"])
    if values.shape != (3, 1, 256):
        raise UnsupportedSettings(f"rescale/normalize changed the shape to {values.shape}")
    return np.ascontiguousarray(values[:, 0, :])


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


def _table_probe(fast: FixedResolutionPreprocessor) -> Image.Image:
    """An image the resize leaves as it is (already the output size) holding every byte in every channel,
    so that each entry of the value table is compared with the processor at least once."""
    edge = fast.shortest_edge or 1
    height, width = fast.fixed_size or (edge, edge)
    count = height * width
    ramp = np.arange(count, dtype=np.int64) * 7 % 256  # 7 is coprime with 256: every byte when count >= 256
    channels = [ramp, (ramp + 85) % 256, 255 - ramp]
    return Image.fromarray(np.stack(channels, axis=-1).astype(np.uint8).reshape(height, width, 3), "RGB")


def _reference(processor: Any) -> Callable[[Image.Image], torch.Tensor]:
    def run(image: Image.Image) -> torch.Tensor:
        return processor(images=[image], return_tensors="pt")["pixel_values"]

    return run


def probe_images() -> list[Image.Image]:
    """Images that exercise every branch: both orientations, odd sizes, smaller than any crop, grey, flat."""
    rng = np.random.default_rng(12)
    sizes = [(320, 240), (240, 320), (640, 480), (224, 224), (384, 384), (500, 37), (37, 500), (97, 61)]
    sizes += [(31, 29), (8, 8), (1, 1), (2, 300), (1023, 767)]
    probes = []
    for width, height in sizes:
        y, x = np.mgrid[0:height, 0:width]
        base = (np.sin(x / rng.uniform(3, 30)) + np.cos(y / rng.uniform(3, 30))) * 60 + 128
        pixels = np.stack([base + rng.normal(0, 40, base.shape) for _ in range(3)], axis=-1)
        probes.append(Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB"))
    probes.append(Image.fromarray(rng.integers(0, 256, (150, 200), dtype=np.uint8), "L").convert("RGB"))
    probes.append(Image.new("RGB", (77, 33), (0, 255, 128)))
    return probes
