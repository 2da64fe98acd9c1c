"""The fast preprocessing paths of CLIP and SigLIP give transformers' exact pixel values, or are not used.

One path per image processor backend: each is checked against the processor of its own backend.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import (
    CLIPImageProcessor,
    CLIPImageProcessorPil,
    SiglipImageProcessor,
    SiglipImageProcessorPil,
)

import mmencode.models.fixed_preprocess as fixed_preprocess
from mmencode.models import load_encoder
from mmencode.models.fixed_preprocess import FixedResolutionPreprocessor, TorchvisionFixedResolutionPreprocessor
from mmencode.models.processor_backend import Backend
from tests.helpers import preprocessing_images, transparent_rgb_image

CPU = torch.device("cpu")
PIL: dict[str, Any] = {"image_processor_backend": "pil"}
# Each backend's processor classes and the fast path that stands in for them.
FAST_PATHS: dict[type, Any] = {
    CLIPImageProcessorPil: FixedResolutionPreprocessor,
    SiglipImageProcessorPil: FixedResolutionPreprocessor,
    CLIPImageProcessor: TorchvisionFixedResolutionPreprocessor,
    SiglipImageProcessor: TorchvisionFixedResolutionPreprocessor,
}
TORCHVISION_OF: dict[type, type] = {
    CLIPImageProcessorPil: CLIPImageProcessor,
    SiglipImageProcessorPil: SiglipImageProcessor,
}

# Settings real checkpoints ship (OpenAI CLIP, SigLIP 224/384) and edge cases of each step.
SETTINGS: list[tuple[type, dict[str, Any]]] = [
    (CLIPImageProcessorPil, {}),
    (CLIPImageProcessorPil, {"size": {"shortest_edge": 64}, "crop_size": {"height": 64, "width": 64}}),
    (CLIPImageProcessorPil, {"size": {"shortest_edge": 336}, "crop_size": {"height": 336, "width": 336}}),
    (CLIPImageProcessorPil, {"size": {"shortest_edge": 40}, "crop_size": {"height": 64, "width": 48}}),  # pads
    (CLIPImageProcessorPil, {"resample": 2, "do_center_crop": False, "size": {"shortest_edge": 30}}),
    (CLIPImageProcessorPil, {"do_normalize": False}),
    (CLIPImageProcessorPil, {"do_rescale": False, "image_mean": 127.5, "image_std": 50.0}),
    (CLIPImageProcessorPil, {"rescale_factor": 1 / 127.5, "image_mean": [1.0, 1.0, 1.0], "image_std": [1, 1, 1]}),
    (CLIPImageProcessorPil, {"resample": 1, "do_convert_rgb": False}),
    (SiglipImageProcessorPil, {}),
    (SiglipImageProcessorPil, {"size": {"height": 384, "width": 384}}),
    (SiglipImageProcessorPil, {"size": {"height": 30, "width": 50}, "resample": 0}),
    (SiglipImageProcessorPil, {"resample": 4, "image_mean": [0.1, 0.2, 0.3], "image_std": [0.9, 0.8, 0.7]}),
]


IMAGES = preprocessing_images()


def _reference(processor: Any, image: Image.Image) -> torch.Tensor:
    return processor(images=[image], return_tensors="pt")["pixel_values"]


# Each setting takes about a second here: the fast selection checks each class's defaults, make test all.
# Every setting on both backends, except BOX resampling, which torchvision does not have.
@pytest.mark.parametrize(
    ("cls", "settings"),
    [
        (backend_cls, settings) if not settings else pytest.param(backend_cls, settings, marks=pytest.mark.slow)
        for cls, settings in SETTINGS
        for backend_cls in (cls, TORCHVISION_OF[cls])
        if not (backend_cls in TORCHVISION_OF.values() and settings.get("resample") == 4)
    ],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_fast_path_is_bit_identical_to_transformers(cls: type, settings: dict[str, Any]) -> None:
    processor = cls(**settings)
    fast = FAST_PATHS[cls].verified(processor)
    assert fast is not None
    for image in IMAGES:
        expected = _reference(processor, image)
        got = fast(image)
        assert got is not None
        assert got.dtype == expected.dtype
        assert torch.equal(got, expected), image.size


def _overriding_resize(cls: type = CLIPImageProcessorPil) -> Any:
    class CustomResize(cls):
        def resize(self, *args: Any, **kwargs: Any) -> Any:
            return super().resize(*args, **kwargs)

    return CustomResize()


@pytest.mark.parametrize(
    "processor",
    [
        CLIPImageProcessorPil(do_resize=False),
        SiglipImageProcessorPil(do_resize=False),
        CLIPImageProcessorPil(size={"shortest_edge": 224, "longest_edge": 300}),
        SiglipImageProcessorPil(do_pad=True, pad_size={"height": 256, "width": 256}),
        _overriding_resize(),
        CLIPImageProcessor(do_resize=False),
        CLIPImageProcessor(size={"shortest_edge": 224, "longest_edge": 300}),
        SiglipImageProcessor(do_pad=True, pad_size={"height": 256, "width": 256}),
        _overriding_resize(CLIPImageProcessor),
        SiglipImageProcessor(resample=4),  # BOX: torchvision has no such filter, transformers' own call fails too
    ],
    ids=[
        "clip-no-resize", "siglip-no-resize", "longest-edge", "pad", "subclass-overrides-resize",
        "tv-no-resize", "tv-longest-edge", "tv-pad", "tv-subclass-overrides-resize", "tv-box-filter",
    ],
)  # fmt: skip
def test_unsupported_settings_keep_transformers(processor: Any, caplog: pytest.LogCaptureFixture) -> None:
    fast_path = FAST_PATHS[next(cls for cls in type(processor).__mro__ if cls in FAST_PATHS)]
    with caplog.at_level(logging.INFO, logger=fixed_preprocess.__name__):
        assert fast_path.verified(processor) is None
    assert "preprocessing with transformers' processor" in caplog.text


def _one_ulp_off(table: np.ndarray) -> np.ndarray:
    table = table.copy()
    table[1, 200] = np.nextafter(table[1, 200], np.float32(np.inf))
    return table


@pytest.mark.parametrize(("backend", "table"), [("pil", "value_table"), ("torchvision", "torchvision_value_table")])
def test_a_probe_that_differs_by_one_ulp_keeps_transformers(
    checkpoints: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    backend: Backend,
    table: str,
) -> None:
    real = getattr(fixed_preprocess, table)
    monkeypatch.setattr(fixed_preprocess, table, lambda *args: _one_ulp_off(real(*args)))
    with caplog.at_level(logging.INFO, logger=fixed_preprocess.__name__):
        adapter = load_encoder(checkpoints["clip"], device=CPU, dtype=torch.float32, image_processor_backend=backend)
    assert adapter.fast_preprocessor is None  # type: ignore[attr-defined]
    assert "differs from transformers'" in caplog.text
    image = IMAGES[0]
    expected = _reference(adapter.processor, image)
    assert torch.equal(adapter.preprocess(image).tensors["pixel_values"], expected)


@pytest.mark.parametrize("backend", ["pil", "torchvision"])
@pytest.mark.parametrize("name", ["clip", "clip-vision", "siglip", "siglip-vision"])
def test_served_checkpoints_take_the_fast_path(checkpoints: dict[str, Path], name: str, backend: Backend) -> None:
    adapter = load_encoder(checkpoints[name], device=CPU, dtype=torch.float32, image_processor_backend=backend)
    assert isinstance(adapter.fast_preprocessor, FAST_PATHS[type(adapter.processor)])  # type: ignore[attr-defined]
    for image in IMAGES[:6]:
        assert torch.equal(adapter.preprocess(image).tensors["pixel_values"], _reference(adapter.processor, image))


@pytest.mark.parametrize("backend", ["pil", "torchvision"])
def test_an_rgb_image_naming_a_transparent_colour_is_composited_as_transformers_does(
    checkpoints: dict[str, Path], backend: Backend
) -> None:
    adapter = load_encoder(checkpoints["clip"], device=CPU, dtype=torch.float32, image_processor_backend=backend)
    image = transparent_rgb_image()
    expected = _reference(adapter.processor, image)  # the transparent half turns white
    assert torch.equal(adapter.preprocess(image).tensors["pixel_values"], expected)
