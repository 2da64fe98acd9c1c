"""Every family added for issue 8, against transformers' own model and processor (specs in tests/families/__init__.py).

Tiny checkpoints are full VLMs saved by transformers 5 (processor in processor_config.json). fp32 on
CPU; a tolerance of 1e-5 absolute covers reassociation between a packed and a per-image forward.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from mmencode.app.engine.worker import EncoderWorker, TokenDrift
from mmencode.models import EncoderAdapter, MetadataError, load_encoder
from tests.families import FAMILIES, FamilySpec, family_params
from tests.helpers import noise_image

CPU = torch.device("cpu")
ATOL = 1e-5
# Landscape, portrait, wide and small, every side odd: none lands on a patch grid, a merge grid, a crop
# boundary or a pixel budget exactly (sides that were multiples of 16 hid Mistral 3's rounding).
IMAGES = [
    noise_image(121, 91, seed=1),
    noise_image(67, 203, seed=2),
    noise_image(301, 163, seed=3),
    noise_image(37, 101, seed=4),
]

# Sizes exactly on each tiny checkpoint's boundaries (its patch x merge grid, crop or tile, pixel budget),
# the other half of the blind spot: a rounding that is right off the grid can be wrong on it.
EDGE_SIZES: dict[str, list[tuple[int, int]]] = {
    # 28-pixel grid; min_pixels 56x56, max_pixels 224x224, and one grid column past the ceiling
    **{family: [(56, 56), (224, 224), (252, 224), (112, 84)] for family in ("qwen2_5_vl", "glm4v")},
    # 32-pixel grid; min_pixels 64x64, max_pixels 256x256, and one grid column past the ceiling
    **{family: [(64, 64), (256, 256), (288, 256), (128, 96)] for family in ("qwen3_vl", "qwen3_5")},
    "kimi_k25": [(56, 56), (112, 84), (512, 512)],  # 28-pixel grid; max_height and max_width 512
    "step3p7": [(168, 168), (336, 168), (112, 112)],  # 168-pixel view, 112-pixel patch
    "mistral3": [(128, 128), (128, 64), (32, 48), (144, 128)],  # 16-pixel grid, longest_edge 128 (and past it)
    "gemma3": [(64, 64), (128, 64), (192, 64)],  # the 64-pixel view; pan-and-scan crops of 64 and 32
    **{family: [(64, 64), (128, 128), (128, 64)] for family in ("idefics3", "smolvlm")},  # 64-pixel tiles, longest 128
    "internvl_chat": [(64, 64), (128, 192), (384, 64)],  # 64-pixel tile; exactly 6 tiles, the ceiling
    # The grid pinpoints, 32 to 96 in steps of 32: the smallest, the largest, one between
    **{family: [(32, 32), (96, 96), (64, 96)] for family in ("llava_onevision", "llava_next")},
}


@pytest.fixture(scope="module", params=family_params())
def spec(request: pytest.FixtureRequest) -> FamilySpec:
    return FAMILIES[request.param]


@pytest.fixture(scope="module")
def checkpoint(spec: FamilySpec, tiny_checkpoint: Callable[..., Path]) -> Path:
    return tiny_checkpoint(spec.family)


@pytest.fixture(scope="module")
def adapter(checkpoint: Path) -> EncoderAdapter:
    return load_encoder(checkpoint, device=CPU, dtype=torch.float32)


def _rows(adapter: EncoderAdapter, images: list) -> list[torch.Tensor]:  # type: ignore[type-arg]
    prepared = [adapter.preprocess(image) for image in images]
    output = adapter.forward(prepared)
    if output.rows_per_item is not None:
        assert output.rows_per_item == [p.num_tokens for p in prepared]
    return list(torch.split(output.rows, [p.num_tokens for p in prepared]))


def test_rows_equal_what_the_full_model_splices_in(spec: FamilySpec, checkpoint: Path, adapter: EncoderAdapter) -> None:
    ours = _rows(adapter, IMAGES)
    reference = spec.reference(checkpoint, IMAGES, adapter)
    assert [tuple(r.shape) for r in ours] == [tuple(r.shape) for r in reference]
    assert all(r.shape[-1] == adapter.hidden_size for r in ours)
    for got, want in zip(ours, reference, strict=True):
        torch.testing.assert_close(got, want.float(), atol=ATOL, rtol=0)


def test_num_tokens_is_the_processors_placeholder_count(spec: FamilySpec, adapter: EncoderAdapter) -> None:
    counts = [adapter.preprocess(image).num_tokens for image in IMAGES]
    assert counts == [spec.placeholders(adapter, image) for image in IMAGES]
    assert len(set(counts)) > 1  # every tiny checkpoint's count depends on the image


def test_sizes_on_the_grid_crop_and_budget_give_the_processors_count_and_the_models_rows(
    spec: FamilySpec, checkpoint: Path, adapter: EncoderAdapter
) -> None:
    images = [noise_image(w, h, seed=20 + i) for i, (w, h) in enumerate(EDGE_SIZES[spec.family])]
    counts = [adapter.preprocess(image).num_tokens for image in images]
    assert counts == [spec.placeholders(adapter, image) for image in images]
    ours = _rows(adapter, images)
    reference = spec.reference(checkpoint, images, adapter)
    assert [tuple(r.shape) for r in ours] == [tuple(r.shape) for r in reference]
    for got, want in zip(ours, reference, strict=True):
        torch.testing.assert_close(got, want.float(), atol=ATOL, rtol=0)


def test_mistral3_image_sizes_are_the_processors(tiny_checkpoint: Callable[..., Path]) -> None:
    """``image_sizes`` is the size PixtralProcessor resizes to (multiples of patch x merge), which the
    language side needs to place the rows: for sizes on and off the 16-pixel grid."""
    from tests.families.llava import _pixtral_processor

    adapter = load_encoder(tiny_checkpoint("mistral3"), device=CPU, dtype=torch.float32)
    processor = _pixtral_processor(adapter)
    for image in [*IMAGES, *(noise_image(w, h) for w, h in EDGE_SIZES["mistral3"])]:
        want = processor(text="[IMG]", images=[image], return_tensors="pt")["image_sizes"][0].tolist()
        assert adapter.preprocess(image).metadata["image_sizes"] == want, image.size


def test_a_packed_batch_equals_single_images(adapter: EncoderAdapter) -> None:
    packed = _rows(adapter, IMAGES)
    for image, got in zip(IMAGES, packed, strict=True):
        torch.testing.assert_close(got, _rows(adapter, [image])[0], atol=ATOL, rtol=0)


def test_metadata_alone_predicts_the_rows(spec: FamilySpec, adapter: EncoderAdapter) -> None:
    for image in IMAGES:
        item = adapter.preprocess(image)
        assert set(spec.required) <= set(item.metadata)
        assert adapter.tokens_from_metadata(item.metadata) == item.num_tokens
        for field in spec.required:
            partial = {k: v for k, v in item.metadata.items() if k != field}
            with pytest.raises(MetadataError) as caught:
                adapter.tokens_from_metadata(partial)
            assert caught.value.field == field and caught.value.missing
    assert tuple(adapter.required_metadata) == spec.required


async def test_drift_is_caught_per_item(spec: FamilySpec, checkpoint: Path, tmp_path: Path) -> None:
    if spec.drifting is None:
        pytest.skip(f"{spec.family}: model and processor settings come from one file and cannot disagree")
    drifting = load_encoder(spec.drifting(checkpoint, tmp_path / "drifting"), device=CPU, dtype=torch.float32)
    items = [drifting.preprocess(image) for image in IMAGES[:2]]
    worker = EncoderWorker(drifting, max_batch_tokens=100_000, max_batch_items=8, batch_wait_s=0.0, max_queue=8)
    worker.start()
    try:
        with pytest.raises(TokenDrift) as caught:
            await worker.encode(items)
    finally:
        await worker.drain(5)
    drift = caught.value
    assert drift.expected == [item.num_tokens for item in items]
    assert drift.produced is not None and len(drift.produced) == 2
    assert all(p != e for p, e in zip(drift.produced, drift.expected, strict=True))


def test_qwen3_vl_rows_name_their_deepstack_split(tiny_checkpoint: Callable[..., Path]) -> None:
    adapter = load_encoder(tiny_checkpoint("qwen3_vl"), device=CPU, dtype=torch.float32)
    item = adapter.preprocess(IMAGES[0])
    # Tiny Qwen3-VL: out_hidden_size 64, DeepStack at two layers -> [main | level_0 | level_1].
    assert item.metadata["deepstack_split"] == [64, 64, 64] and adapter.hidden_size == 192
    with pytest.raises(MetadataError, match="deepstack_split") as caught:
        adapter.tokens_from_metadata({**item.metadata, "deepstack_split": [64]})
    assert not caught.value.missing
