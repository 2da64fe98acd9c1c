"""The fast preprocessing paths of the Qwen2-VL processors (PIL and torchvision) give transformers' exact
outputs, or are not used."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import (
    CLIPImageProcessorPil,
    Glm4vImageProcessor,
    Glm4vImageProcessorPil,
    Qwen2VLImageProcessor,
    Qwen2VLImageProcessorPil,
)

import mmencode.models.dynamic_preprocess as dynamic_preprocess
from mmencode.models import load_encoder
from mmencode.models.dynamic_preprocess import DynamicResolutionPreprocessor, TorchvisionDynamicResolutionPreprocessor
from mmencode.models.processor_backend import Backend
from tests.helpers import noise_image, preprocessing_images, transparent_rgb_image

CPU = torch.device("cpu")
# Each backend's processor class and the fast path that stands in for it.
PROCESSOR_OF: dict[str, type] = {"pil": Qwen2VLImageProcessorPil, "torchvision": Qwen2VLImageProcessor}
FAST_PATH_OF: dict[str, type[DynamicResolutionPreprocessor]] = {
    "pil": DynamicResolutionPreprocessor,
    "torchvision": TorchvisionDynamicResolutionPreprocessor,
}
BACKENDS = ["pil", "torchvision"]
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

# As released checkpoints ship them (read with from_dict, as the adapters do), and edge cases of each step.
SETTINGS: dict[str, dict[str, Any]] = {
    "qwen2-vl-defaults": {},  # min 56*56, max 28*28*1280
    "qwen2.5-vl-7b": {
        "min_pixels": 3136,
        "max_pixels": 12845056,
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": CLIP_MEAN,
        "image_std": CLIP_STD,
        "image_processor_type": "Qwen2VLImageProcessor",
    },
    "qwen3-vl": {
        "size": {"longest_edge": 16777216, "shortest_edge": 65536},
        "patch_size": 16,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "image_processor_type": "Qwen2VLImageProcessorFast",
    },
    "bench-mid": {"size": {"shortest_edge": 56 * 56, "longest_edge": 336 * 336}},
    "small-max-pixels": {"size": {"shortest_edge": 28 * 28, "longest_edge": 28 * 28 * 8}},  # most images shrink
    "large-min-pixels": {"size": {"shortest_edge": 448 * 448, "longest_edge": 896 * 896}},  # most images grow
    "nearest": {"resample": 0},
    "lanczos": {"resample": 1},
    "bilinear": {"resample": 2},
    "box": {"resample": 4},
    "hamming": {"resample": 5},
    "no-normalize": {"do_normalize": False},
    "no-rescale-no-normalize": {"do_rescale": False, "do_normalize": False},  # uint8 cast to float32
    "own-scale-mean-std": {"rescale_factor": 1 / 127.5, "image_mean": [1.0, 0.9, 1.1], "image_std": [1, 2, 0.5]},
    "merge-1-temporal-1": {"merge_size": 1, "temporal_patch_size": 1},
    "patch-8-temporal-3": {
        "patch_size": 8,
        "temporal_patch_size": 3,
        "size": {"shortest_edge": 256, "longest_edge": 2**18},
    },
    "no-convert-rgb": {"do_convert_rgb": False},
}


def _images() -> list[Image.Image]:
    images = preprocessing_images()  # one of them is past the aspect ratio of 200 smart_resize refuses
    sizes = [(1, 1), (2, 300), (300, 2), (1, 200), (1023, 767), (767, 1023), (1400, 1000), (56, 56), (392, 392)]
    images += [noise_image(width, height, seed=60 + i) for i, (width, height) in enumerate(sizes)]
    images.append(Image.new("RGB", (640, 480), (12, 200, 99)))
    return images


IMAGES = _images()


def _processor(settings: dict[str, Any], backend: str = "pil") -> Any:
    return PROCESSOR_OF[backend].from_dict(settings)


def _reference(processor: Any, image: Image.Image) -> Mapping[str, torch.Tensor]:
    return processor(images=[image], return_tensors="pt")


def _outcome(run: Callable[[Image.Image], Mapping[str, torch.Tensor] | None], image: Image.Image) -> Any:
    """The outputs, or the error, as a user would see them."""
    try:
        out = run(image)
    except ValueError as exc:
        return f"ValueError: {exc}"
    assert out is not None, image.size
    return {key: (value.dtype, value.shape, value) for key, value in out.items()}


def _assert_same(got: Any, expected: Any, image: Image.Image) -> None:
    if isinstance(expected, str):
        assert got == expected, image.size
        return
    assert isinstance(got, dict) and set(got) == set(expected), image.size
    for key, (dtype, shape, value) in expected.items():
        assert got[key][:2] == (dtype, shape), (key, image.size)
        assert torch.equal(got[key][2], value), (key, image.size)


# Filters torchvision does not have: transformers' own torchvision processor cannot run them either.
NOT_IN_TORCHVISION = {"box", "hamming"}


# Each setting takes about a second here: the fast selection checks the defaults, make test all of them.
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "name", [name if name == "qwen2-vl-defaults" else pytest.param(name, marks=pytest.mark.slow) for name in SETTINGS]
)
def test_fast_path_is_bit_identical_to_transformers(name: str, backend: str) -> None:
    if backend == "torchvision" and name in NOT_IN_TORCHVISION:
        pytest.skip(f"torchvision has no {name} filter")
    processor = _processor(SETTINGS[name], backend)
    fast = FAST_PATH_OF[backend].verified(processor)
    assert fast is not None
    for image in IMAGES:
        _assert_same(_outcome(fast, image), _outcome(lambda i: _reference(processor, i), image), image)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("size", [(201, 1), (1, 250), (9000, 40)])
def test_an_aspect_ratio_past_200_fails_with_transformers_error(size: tuple[int, int], backend: str) -> None:
    processor = _processor(SETTINGS["qwen2-vl-defaults"], backend)
    fast = FAST_PATH_OF[backend].verified(processor)
    assert fast is not None
    image = noise_image(*size, seed=5)
    with pytest.raises(ValueError, match="aspect ratio must be smaller than 200") as fast_error:
        fast(image)
    with pytest.raises(ValueError) as reference_error:
        _reference(processor, image)
    assert str(fast_error.value) == str(reference_error.value)


@pytest.mark.parametrize("name", ["qwen2-vl-defaults", "qwen2.5-vl-7b", "qwen3-vl", "bench-mid", "patch-8-temporal-3"])
def test_the_table_probe_holds_every_byte_at_a_size_the_resize_keeps(name: str) -> None:
    fast = DynamicResolutionPreprocessor(_processor(SETTINGS[name]))
    table_probe = np.asarray(fast.own_probes()[0])
    height, width = table_probe.shape[:2]
    assert fast.output_size(width, height) == (height, width)
    for channel in range(3):
        assert len(np.unique(table_probe[:, :, channel])) == 256


@pytest.mark.parametrize("name", ["qwen2-vl-defaults", "bench-mid", "small-max-pixels"])
def test_probes_reach_both_ends_of_smart_resize(name: str) -> None:
    fast = DynamicResolutionPreprocessor(_processor(SETTINGS[name]))
    areas = [(image.width * image.height, math.prod(fast.output_size(*image.size))) for image in fast.own_probes()]
    assert any(after > before for before, after in areas)  # scaled up to min_pixels
    assert any(before > fast.max_pixels >= after for before, after in areas)  # scaled down to max_pixels


class _ResizeSubclass(Qwen2VLImageProcessorPil):
    def resize(self, image: Any, size: Any, resample: Any, factor: int, **kwargs: Any) -> Any:
        return super().resize(image, size, resample, factor, **kwargs)


class _PlainSubclass(Qwen2VLImageProcessorPil):
    pass


def _patched_instance() -> Qwen2VLImageProcessorPil:
    processor = Qwen2VLImageProcessorPil()
    processor.patchify = processor.patchify  # type: ignore[method-assign]
    return processor


class _TorchvisionResizeSubclass(Qwen2VLImageProcessor):
    def resize(self, images: Any, size: Any, resample: Any, factor: int, **kwargs: Any) -> Any:
        return super().resize(images, size, resample, factor, **kwargs)


def _patched_torchvision_instance() -> Qwen2VLImageProcessor:
    processor = Qwen2VLImageProcessor()
    processor.rescale_and_normalize = processor.rescale_and_normalize  # type: ignore[method-assign]
    return processor


@pytest.mark.parametrize(
    "make",
    [
        lambda: Qwen2VLImageProcessorPil(do_resize=False),
        lambda: Qwen2VLImageProcessorPil(size={"height": 224, "width": 224}),
        lambda: Qwen2VLImageProcessorPil(size={"shortest_edge": 3136}),
        lambda: Qwen2VLImageProcessorPil(patch_size=14.0),
        _ResizeSubclass,
        _PlainSubclass,
        _patched_instance,
        Glm4vImageProcessorPil,
        CLIPImageProcessorPil,
    ],
    ids=[
        "no-resize",
        "fixed-size",
        "no-max-pixels",
        "float-patch-size",
        "subclass-overrides-resize",
        "subclass",
        "instance-patches-patchify",
        "glm4v",
        "clip",
    ],
)
def test_unsupported_processors_keep_transformers(make: Callable[[], Any], caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=dynamic_preprocess.__name__):
        assert DynamicResolutionPreprocessor.verified(make()) is None
    assert "preprocessing with transformers' processor (no fast path" in caplog.text


@pytest.mark.parametrize(
    "make",
    [
        lambda: Qwen2VLImageProcessor(do_resize=False),
        lambda: Qwen2VLImageProcessor(size={"shortest_edge": 3136}),
        _TorchvisionResizeSubclass,
        _patched_torchvision_instance,
        Glm4vImageProcessor,
        Qwen2VLImageProcessorPil,  # the other backend's class: the PIL path's
    ],
    ids=["no-resize", "no-max-pixels", "subclass-overrides-resize", "instance-patches-rescale", "glm4v", "pil-class"],
)
def test_unsupported_torchvision_processors_keep_transformers(
    make: Callable[[], Any], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger=dynamic_preprocess.__name__):
        assert TorchvisionDynamicResolutionPreprocessor.verified(make()) is None
    assert "preprocessing with transformers' processor (no fast path" in caplog.text


# Each backend's table, by the name the module looks it up under.
TABLE_OF = {"pil": "value_table", "torchvision": "torchvision_value_table"}


def _one_ulp_off_table(backend: str, channel: int, byte: int) -> Callable[[Any, Any], np.ndarray]:
    real = getattr(dynamic_preprocess, TABLE_OF[backend])

    def table(processor: Any, settings: Any) -> np.ndarray:
        values = np.array(real(processor, settings))
        values[channel, byte] = np.nextafter(values[channel, byte], np.float32(np.inf))
        return values

    return table


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("channel", "byte"), [(0, 0), (1, 200), (2, 255)])
def test_a_table_one_ulp_off_is_rejected(
    channel: int, byte: int, backend: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(dynamic_preprocess, TABLE_OF[backend], _one_ulp_off_table(backend, channel, byte))
    with caplog.at_level(logging.INFO, logger=dynamic_preprocess.__name__):
        assert FAST_PATH_OF[backend].verified(_processor(SETTINGS["bench-mid"], backend)) is None
    assert "differs from transformers'" in caplog.text


class _SwapsTwoPatches(DynamicResolutionPreprocessor):
    def outputs(self, image: Image.Image) -> dict[str, torch.Tensor] | None:
        out = super().outputs(image)
        assert out is not None
        out["pixel_values"][[0, -1]] = out["pixel_values"][[-1, 0]]
        return out


class _Int32Grid(DynamicResolutionPreprocessor):
    def outputs(self, image: Image.Image) -> dict[str, torch.Tensor] | None:
        out = super().outputs(image)
        assert out is not None
        return {**out, "image_grid_thw": out["image_grid_thw"].to(torch.int32)}


@pytest.mark.parametrize("cls", [_SwapsTwoPatches, _Int32Grid])
def test_a_wrong_patch_order_or_grid_type_is_rejected(cls: type[DynamicResolutionPreprocessor]) -> None:
    assert cls.verified(_processor(SETTINGS["bench-mid"])) is None


def test_a_probe_the_processor_refuses_keeps_transformers_instead_of_failing_the_load(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A 1x300 probe is past smart_resize's aspect-ratio limit of 200: transformers raises on it.
    refused = Image.new("RGB", (1, 300), (10, 20, 30))
    with caplog.at_level(logging.WARNING, logger="mmencode.models.dynamic_preprocess"):
        assert DynamicResolutionPreprocessor.verified(_processor(SETTINGS["bench-mid"]), [refused]) is None
    assert "1x300 probe image failed (ValueError" in caplog.text


@pytest.mark.parametrize(
    "make",
    [
        transparent_rgb_image,  # transformers composites the transparent half over white
        lambda: noise_image(70, 50, seed=1, mode="RGBA"),
        lambda: noise_image(70, 50, seed=2, mode="L"),
        lambda: noise_image(70, 50, seed=3).convert("P"),
    ],
    ids=["rgb-naming-a-transparent-colour", "rgba", "grey", "palette"],
)
@pytest.mark.parametrize("backend", BACKENDS)
def test_images_not_plain_rgb_take_transformers_path(
    make: Callable[[], Image.Image], backend: Backend, tiny_checkpoint: Callable[..., Path]
) -> None:
    adapter = load_encoder(
        tiny_checkpoint("qwen2_vl"), device=CPU, dtype=torch.float32, image_processor_backend=backend
    )
    fast = adapter.fast_preprocessor  # type: ignore[attr-defined]
    assert fast is not None
    image = make()
    assert fast(image) is None
    expected = _reference(adapter.processor, image)
    item = adapter.preprocess(image)
    for key in ("pixel_values", "image_grid_thw"):
        assert torch.equal(item.tensors[key], expected[key])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_wrong_table_at_load_keeps_transformers(
    backend: Backend,
    tiny_checkpoint: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(dynamic_preprocess, TABLE_OF[backend], _one_ulp_off_table(backend, 1, 128))
    with caplog.at_level(logging.INFO, logger=dynamic_preprocess.__name__):
        adapter = load_encoder(
            tiny_checkpoint("qwen2_vl"), device=CPU, dtype=torch.float32, image_processor_backend=backend
        )
    assert adapter.fast_preprocessor is None  # type: ignore[attr-defined]
    assert "qwen2_vl encoder: the fast preprocessing path differs" in caplog.text
    image = IMAGES[0]
    expected = _reference(adapter.processor, image)
    assert torch.equal(adapter.preprocess(image).tensors["pixel_values"], expected["pixel_values"])


@pytest.mark.parametrize(
    ("family", "options", "fast"),
    [
        ("qwen2_vl", {}, True),
        ("qwen2_vl", {"layout": "vision"}, True),
        ("qwen3_vl", {}, True),
        ("qwen3_5", {}, True),
        ("glm4v", {}, False),  # its own processor class: transformers' path
    ],
    ids=["qwen2_vl", "qwen2_vl-vision", "qwen3_vl", "qwen3_5", "glm4v"],
)
@pytest.mark.parametrize("backend", BACKENDS)
def test_which_checkpoints_take_the_fast_path(
    family: str, options: dict[str, Any], fast: bool, backend: Backend, tiny_checkpoint: Callable[..., Path]
) -> None:
    adapter = load_encoder(
        tiny_checkpoint(family, **options), device=CPU, dtype=torch.float32, image_processor_backend=backend
    )
    if fast:
        assert type(adapter.processor) is PROCESSOR_OF[backend]
        assert type(adapter.fast_preprocessor) is FAST_PATH_OF[backend]  # type: ignore[attr-defined]
    else:
        assert adapter.fast_preprocessor is None  # type: ignore[attr-defined]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
def test_served_items_and_rows_are_the_same_with_the_fast_path_off(
    family: str, backend: Backend, tiny_checkpoint: Callable[..., Path]
) -> None:
    adapter = load_encoder(tiny_checkpoint(family), device=CPU, dtype=torch.float32, image_processor_backend=backend)
    assert type(adapter.fast_preprocessor) is FAST_PATH_OF[backend]  # type: ignore[attr-defined]
    images = [noise_image(120, 90, seed=1), noise_image(64, 200, seed=2), noise_image(333, 251, seed=3)]
    fast_items = [adapter.preprocess(image) for image in images]
    adapter.fast_preprocessor = None  # type: ignore[attr-defined]
    reference_items = [adapter.preprocess(image) for image in images]
    for fast_item, reference_item in zip(fast_items, reference_items, strict=True):
        assert fast_item.metadata == reference_item.metadata
        assert fast_item.num_tokens == reference_item.num_tokens
        assert fast_item.tensors.keys() == reference_item.tensors.keys()
        for key, tensor in reference_item.tensors.items():
            assert fast_item.tensors[key].dtype == tensor.dtype
            assert torch.equal(fast_item.tensors[key], tensor)
    with torch.inference_mode():
        fast_rows = adapter.forward(fast_items).rows
        reference_rows = adapter.forward(reference_items).rows
    assert torch.equal(fast_rows, reference_rows)
