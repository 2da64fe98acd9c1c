"""Checkpoints in the layouts users really download load, and their processor settings are honoured.

Each test starts from a tiny checkpoint, rewrites it into one real-world layout, and checks what a user
would notice: it loads, it yields the rows of the original, and the settings it ships are the ones used
(and fingerprinted, so two different processor configs never share a content hash).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen2VLImageProcessor, Qwen2VLImageProcessorPil

from mmencode.models import CheckpointError, EncoderAdapter, load_encoder
from mmencode.models.processor_backend import Backend
from mmencode.models.tiny import build_tiny
from tests.families import opengvlab_to_transformers
from tests.helpers import noise_image

CPU = torch.device("cpu")
IMAGES = [noise_image(120, 90, seed=1), noise_image(64, 200, seed=2), noise_image(300, 160, seed=3)]


def _load(directory: Path) -> EncoderAdapter:
    return load_encoder(directory, device=CPU, dtype=torch.float32)


def _rows(adapter: EncoderAdapter) -> list[torch.Tensor]:
    prepared = [adapter.preprocess(image) for image in IMAGES]
    return list(torch.split(adapter.forward(prepared).rows, [p.num_tokens for p in prepared]))


def _same_rows(a: EncoderAdapter, b: EncoderAdapter) -> None:
    for got, want in zip(_rows(a), _rows(b), strict=True):
        assert torch.equal(got, want)


@pytest.fixture(scope="module")
def legacy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("legacy") / "ckpt", "qwen2_vl", processor_layout="legacy")


@pytest.fixture(scope="module")
def nested(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("nested") / "ckpt", "qwen2_vl", processor_layout="nested")


def test_processor_saved_by_transformers_5_loads(legacy: Path, nested: Path) -> None:
    assert not (nested / "preprocessor_config.json").exists()
    assert "image_processor" in json.loads((nested / "processor_config.json").read_text())
    _same_rows(_load(nested), _load(legacy))


def test_the_nested_processor_config_is_read_and_fingerprinted(nested: Path, tmp_path: Path) -> None:
    edited = tmp_path / "edited"
    shutil.copytree(nested, edited)
    whole = json.loads((edited / "processor_config.json").read_text())
    # A smaller pixel budget: the big image is resized further and yields fewer rows.
    whole["image_processor"]["size"]["longest_edge"] = 28 * 28 * 8
    (edited / "processor_config.json").write_text(json.dumps(whole))
    original, changed = _load(nested), _load(edited)
    assert changed.preprocess(IMAGES[2]).num_tokens <= 8 < original.preprocess(IMAGES[2]).num_tokens
    assert changed.fingerprint != original.fingerprint


@pytest.mark.parametrize(
    ("backend", "processor_class"), [("pil", Qwen2VLImageProcessorPil), ("torchvision", Qwen2VLImageProcessor)]
)
def test_a_config_naming_the_torchvision_processor_loads_the_chosen_backend(
    legacy: Path, tmp_path: Path, backend: Backend, processor_class: type
) -> None:
    # As the Qwen2-VL / Qwen3-VL repos ship it: the Fast class, and min/max_pixels instead of size.
    fast = tmp_path / "fast"
    shutil.copytree(legacy, fast)
    settings = json.loads((fast / "preprocessor_config.json").read_text())
    settings.pop("size")
    settings.update(
        image_processor_type="Qwen2VLImageProcessorFast", min_pixels=56 * 56, max_pixels=28 * 28 * 16, merge_size=2
    )
    (fast / "preprocessor_config.json").write_text(json.dumps(settings))
    adapter = load_encoder(fast, device=CPU, dtype=torch.float32, image_processor_backend=backend)
    assert type(adapter.processor) is processor_class
    assert adapter.image_processor_backend == backend
    # The checkpoint's pixel budget, not a default: what the same settings give in transformers directly.
    reference = processor_class(min_pixels=56 * 56, max_pixels=28 * 28 * 16, patch_size=14, merge_size=2)
    for image in IMAGES:
        grid = reference(images=[image], return_tensors="pt")["image_grid_thw"][0].tolist()
        assert adapter.preprocess(image).metadata["image_grid_thw"] == grid
    assert adapter.preprocess(IMAGES[2]).num_tokens <= 16


def test_nulls_beside_a_processor_config_with_only_processor_settings(legacy: Path, tmp_path: Path) -> None:
    # Gemma 3's repos: preprocessor_config.json with nulls, processor_config.json with only image_seq_length.
    quirky = tmp_path / "quirky"
    shutil.copytree(legacy, quirky)
    settings = json.loads((quirky / "preprocessor_config.json").read_text())
    settings.update(do_convert_rgb=None, resample=None, image_mean=None)
    (quirky / "preprocessor_config.json").write_text(json.dumps(settings))
    (quirky / "processor_config.json").write_text(json.dumps({"image_seq_length": 256, "processor_class": "X"}))
    adapter = _load(quirky)
    assert adapter.processor_config.setting("image_seq_length") == 256
    # The nulls meant "the class default", and the defaults here are what the original wrote.
    _same_rows(adapter, _load(legacy))


def test_no_processor_settings_anywhere_is_refused(nested: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    shutil.copytree(nested, bare)
    whole = json.loads((bare / "processor_config.json").read_text())
    del whole["image_processor"]
    (bare / "processor_config.json").write_text(json.dumps(whole))
    with pytest.raises(CheckpointError, match=r"no image processor settings.*preprocessor_config\.json"):
        _load(bare)


def test_sharded_safetensors_load_like_a_single_file(legacy: Path, tmp_path: Path) -> None:
    sharded = build_tiny(tmp_path / "sharded", "qwen2_vl", processor_layout="legacy", max_shard_size="20KB")
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert not (sharded / "model.safetensors").exists()
    one, many = _load(legacy), _load(sharded)
    _same_rows(many, one)
    # Same tensors, configs and processor: the same identity, so the same content hashes.
    assert many.fingerprint == one.fingerprint


# ----- InternVL in OpenGVLab's layout (model_type internvl_chat) -----
@pytest.fixture(scope="module")
def opengvlab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("opengvlab") / "ckpt", "internvl_chat")


def test_opengvlab_checkpoints_use_the_repos_tensor_names(opengvlab: Path) -> None:
    keys = set(load_file(str(opengvlab / "model.safetensors")))
    # As InternVLChatModel names them (vision_model = InternVisionModel, mlp1 = the projector).
    layer = "vision_model.encoder.layers.0."
    expected = {
        "vision_model.embeddings.class_embedding",
        "vision_model.embeddings.position_embedding",
        "vision_model.embeddings.patch_embedding.weight",
        *(layer + n for n in ("ls1", "ls2", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight", "norm1.weight")),
        *(layer + n for n in ("norm2.bias", "mlp.fc1.weight", "mlp.fc2.bias")),
        "mlp1.0.weight",
        "mlp1.1.weight",
        "mlp1.3.bias",
    }
    assert expected <= keys
    assert not any(key.startswith(("model.", "vision_tower.", "multi_modal_projector.")) for key in keys)
    assert json.loads((opengvlab / "config.json").read_text())["model_type"] == "internvl_chat"


def test_opengvlab_layout_equals_the_converted_transformers_checkpoint(opengvlab: Path, tmp_path: Path) -> None:
    converted = opengvlab_to_transformers(opengvlab, tmp_path / "converted")
    original, twin = _load(opengvlab), _load(converted)
    for image in IMAGES:
        a, b = original.preprocess(image), twin.preprocess(image)
        assert a.metadata == b.metadata and a.num_tokens == b.num_tokens
    _same_rows(original, twin)


def test_opengvlab_tiling_settings_come_from_config_json(opengvlab: Path, tmp_path: Path) -> None:
    fewer = tmp_path / "fewer"
    shutil.copytree(opengvlab, fewer)
    config = json.loads((fewer / "config.json").read_text())
    config["max_dynamic_patch"] = 2
    (fewer / "config.json").write_text(json.dumps(config))
    original, changed = _load(opengvlab), _load(fewer)
    # 120x90: six tiles + thumbnail with max_dynamic_patch 6, at most two + thumbnail with 2.
    before = original.preprocess(IMAGES[0]).metadata["num_patches"]
    after = changed.preprocess(IMAGES[0]).metadata["num_patches"]
    assert before == 7 and after <= 3
    assert changed.fingerprint != original.fingerprint


def test_opengvlab_checkpoint_missing_or_extra_tensors_is_refused(opengvlab: Path, tmp_path: Path) -> None:
    tensors = load_file(str(opengvlab / "model.safetensors"))
    cases = (
        # A fused qkv feeds three projections: all three are missing.
        ("missing", "vision_model.encoder.layers.1.attn.qkv.weight", r"3 missing .*layer\.1\.attention\.k_proj"),
        ("extra", "mlp1.5.weight", r"1 unexpected .*mlp1\.5\.weight"),
    )
    for name, edit, message in cases:
        broken = tmp_path / name
        shutil.copytree(opengvlab, broken)
        edited = dict(tensors)
        if name == "missing":
            del edited[edit]
        else:
            edited[edit] = torch.zeros(2)
        save_file(edited, str(broken / "model.safetensors"), metadata={"format": "pt"})
        with pytest.raises(CheckpointError, match=message):
            _load(broken)
