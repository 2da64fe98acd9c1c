"""What the fast preprocessing paths share: the byte-value table, the settings checks, and the proof.

transformers' PIL image processors rescale and normalise an image after its PIL resize, when every
value is still a uint8, and both steps act on each value alone (``float32(float64(x) * scale)``, then
``(x - mean) / std`` in float32). So their output is a function of (channel, byte) with 3 x 256
entries: :func:`value_table` fills it by running the processor's *own* ``rescale`` and ``normalize``
on a ramp of the 256 bytes, so whatever they compute, the table holds. A fast path then resizes with
PIL exactly as the processor does and looks each byte up in the table.

Nothing is trusted on its reasoning alone: :meth:`VerifiedPreprocessor.verified` builds a fast path
only for settings it replicates, then compares every output with the processor's on probe images
(sizes, aspect ratios, greyscale made RGB, a flat colour, and the path's own probes, among them one
that holds every byte in every channel) and returns ``None``, meaning "use transformers", when any
probe differs by a single bit.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Self

import numpy as np
import torch
from PIL import Image

__all__ = [
    "UnsupportedSettings",
    "VerifiedPreprocessor",
    "byte_ramp_image",
    "effective_settings",
    "noise_probe",
    "pil_resample",
    "plain_rgb",
    "probe_images",
    "require_own_steps",
    "same_outputs",
    "torchvision_value_table",
    "value_table",
]

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


class VerifiedPreprocessor(abc.ABC):
    """A fast path to a processor's exact outputs, handed out only once it matched them on probes."""

    @abc.abstractmethod
    def __init__(self, processor: Any) -> None:
        """Raise :class:`UnsupportedSettings` for a processor whose steps or settings are not replicated."""

    @abc.abstractmethod
    def outputs(self, image: Image.Image) -> Mapping[str, torch.Tensor] | None:
        """What ``processor(images=[image], return_tensors="pt")`` holds, or ``None`` for transformers."""

    @abc.abstractmethod
    def own_probes(self) -> list[Image.Image]:
        """Probe images that depend on the settings (at least the table probe: see :func:`byte_ramp_image`)."""

    @classmethod
    def verified(cls, processor: Any, probes: Sequence[Image.Image] | None = None, *, label: str = "") -> Self | None:
        """The fast path if it matches ``processor`` bit for bit on every probe image, else ``None``."""
        # The subclass's module names the log lines: they say which path serves which checkpoint.
        logger = logging.getLogger(cls.__module__)
        name = label or type(processor).__name__
        try:
            fast = cls(processor)
        except UnsupportedSettings as exc:
            logger.info("%s: preprocessing with transformers' processor (no fast path: %s)", name, exc)
            return None
        probes = [*(probe_images() if probes is None else probes), *fast.own_probes()]
        for probe in probes:
            try:
                same = same_outputs(fast.outputs(probe), processor(images=[probe], return_tensors="pt"))
            except Exception as exc:  # a probe these settings refuse must not fail the model's load
                logger.warning(
                    "%s: a %dx%d probe image failed (%s: %s); preprocessing with transformers' processor",
                    name,
                    *probe.size,
                    type(exc).__name__,
                    exc,
                )
                return None
            if not same:
                logger.warning(
                    "%s: the fast preprocessing path differs from transformers' on a %dx%d probe image; "
                    "preprocessing with transformers' processor",
                    name,
                    *probe.size,
                )
                return None
        logger.info("%s: fast preprocessing, bit-identical to transformers' on %d probe images", name, len(probes))
        return fast


def same_outputs(got: Mapping[str, torch.Tensor] | None, expected: Mapping[str, Any]) -> bool:
    """Bit for bit: the same tensors under the same keys, each of the same dtype (never so when ``got`` is ``None``)."""
    if got is None or set(got) != set(expected):
        return False
    return all(got[key].dtype == expected[key].dtype and torch.equal(got[key], expected[key]) for key in expected)


def require_own_steps(processor: Any, supported: tuple[type, ...], steps: Mapping[str, type]) -> None:
    """Exactly one of the ``supported`` classes, each step in ``steps`` the named class's own.

    A subclass may override any step, so only the exact classes qualify; each step must also be the
    one the fast path was written against, so that a transformers release that moves a step into the
    class (or a method patched onto the class or the instance) turns the fast path off.
    """
    cls = type(processor)
    if cls not in supported:
        raise UnsupportedSettings(f"{cls.__name__} is not one of the replicated processors")
    for name, owner in steps.items():
        if getattr(cls, name) is not getattr(owner, name) or name in vars(processor):
            raise UnsupportedSettings(f"{cls.__name__} overrides {name}")


def effective_settings(processor: Any) -> dict[str, Any]:
    """The keyword arguments ``preprocess`` resolves from the processor's attributes when none are passed."""
    kwargs = {name: getattr(processor, name, None) for name in processor._valid_kwargs_names}
    return dict(processor._standardize_kwargs(**kwargs))


def plain_rgb(image: Image.Image) -> bool:
    """Whether a fast path may take the image: transformers composites an image with transparency over
    white, even an RGB one that only names a transparent colour, and converts other modes; such images
    take the processor's own path."""
    return image.mode == "RGB" and image.info.get("transparency") is None


def pil_resample(settings: Mapping[str, Any]) -> int:
    """The PIL filter ``PilBackend.resize`` uses for these settings (``None`` means bilinear there)."""
    resample = settings.get("resample")
    resample = int(Image.Resampling.BILINEAR) if resample is None else resample
    if not isinstance(resample, int) or int(resample) not in _PIL_FILTERS:
        raise UnsupportedSettings(f"resample={resample!r} is not a PIL filter")
    return int(resample)


def value_table(processor: Any, settings: Mapping[str, Any]) -> np.ndarray:
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


def torchvision_value_table(processor: Any, settings: Mapping[str, Any]) -> np.ndarray:
    """(3, 256): a torchvision processor's own fused rescale-and-normalise of every byte of every channel."""
    ramp = torch.arange(256, dtype=torch.uint8).expand(1, 3, 1, 256).contiguous()  # a batch, as _preprocess has
    values = processor.rescale_and_normalize(
        ramp,
        settings.get("do_rescale"),
        settings.get("rescale_factor"),
        settings.get("do_normalize"),
        settings.get("image_mean"),
        settings.get("image_std"),
    )
    if tuple(values.shape) != (1, 3, 1, 256):
        raise UnsupportedSettings(f"rescale_and_normalize changed the shape to {tuple(values.shape)}")
    return np.ascontiguousarray(values[0, :, 0, :].numpy())


def byte_ramp_image(width: int, height: int) -> Image.Image:
    """An RGB image holding every byte in every channel (once ``width * height >= 256``).

    Made at a size the resize leaves as it is, it compares each entry of the value table with the
    processor at least once.
    """
    ramp = np.arange(width * height, dtype=np.int64) * 7 % 256  # 7 is coprime with 256: every byte
    channels = [ramp, (ramp + 85) % 256, 255 - ramp]
    return Image.fromarray(np.stack(channels, axis=-1).astype(np.uint8).reshape(height, width, 3), "RGB")


def probe_images() -> list[Image.Image]:
    """Images that exercise every branch: both orientations, odd sizes, smaller than any crop, grey, flat."""
    rng = np.random.default_rng(12)
    sizes = [(320, 240), (240, 320), (640, 480), (224, 224), (384, 384), (500, 37), (37, 500), (97, 61)]
    sizes += [(31, 29), (8, 8), (1, 1), (2, 300), (1023, 767)]
    probes = [noise_probe(width, height, rng) for width, height in sizes]
    probes.append(Image.fromarray(rng.integers(0, 256, (150, 200), dtype=np.uint8), "L").convert("RGB"))
    probes.append(Image.new("RGB", (77, 33), (0, 255, 128)))
    return probes


def noise_probe(width: int, height: int, rng: np.random.Generator) -> Image.Image:
    """Smooth waves plus noise: neighbours differ, as in a photograph, and the filters' weights all count."""
    y, x = np.mgrid[0:height, 0:width]
    base = (np.sin(x / rng.uniform(3, 30)) + np.cos(y / rng.uniform(3, 30))) * 60 + 128
    pixels = np.stack([base + rng.normal(0, 40, base.shape) for _ in range(3)], axis=-1)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")
