"""Loading takes exactly the encoder's weights, and refuses checkpoints that do not fit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import blake3
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

from mmencode.models import CheckpointError, load_encoder
from mmencode.models.tiny import build_tiny

CPU = torch.device("cpu")


def _rewrite(src: Path, dst: Path, edit: dict[str, torch.Tensor | None]) -> Path:
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    for key, value in edit.items():
        if value is None:
            tensors.pop(key)
        else:
            tensors[key] = value
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_missing_vision_weight_fails_loudly(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    broken = _rewrite(checkpoints["qwen2_vl"], tmp_path / "broken", {"visual.blocks.1.mlp.fc2.weight": None})
    with pytest.raises(CheckpointError, match=r"1 missing .*blocks\.1\.mlp\.fc2\.weight"):
        load_encoder(broken, device=CPU, dtype=torch.float32)


def test_unexpected_vision_weight_fails_loudly(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    extra = _rewrite(checkpoints["internvl"], tmp_path / "extra", {"vision_tower.encoder.layer.9.x": torch.zeros(2)})
    with pytest.raises(CheckpointError, match=r"1 unexpected .*encoder\.layer\.9\.x"):
        load_encoder(extra, device=CPU, dtype=torch.float32)


def test_wrong_shape_fails_loudly(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    key = "vision_model.embeddings.position_embedding.weight"
    reshaped = _rewrite(checkpoints["siglip"], tmp_path / "reshaped", {key: torch.zeros(16, 32)})
    with pytest.raises(CheckpointError, match=r"position_embedding\.weight has shape"):
        load_encoder(reshaped, device=CPU, dtype=torch.float32)


def test_checkpoint_without_encoder_weights_is_refused(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    # A Qwen2-VL config over SigLIP weights: nothing under any Qwen2-VL prefix.
    impostor = tmp_path / "impostor"
    shutil.copytree(checkpoints["siglip"], impostor)
    shutil.copy(checkpoints["qwen2_vl"] / "config.json", impostor / "config.json")
    shutil.copy(checkpoints["qwen2_vl"] / "preprocessor_config.json", impostor / "preprocessor_config.json")
    with pytest.raises(CheckpointError, match="no encoder weights found"):
        load_encoder(impostor, device=CPU, dtype=torch.float32)


def test_the_vision_class_alone_would_silently_load_random_weights(checkpoints: dict[str, Path]) -> None:
    """Why the loader exists: from_pretrained of the tower on a full checkpoint 'succeeds'."""
    naive = Qwen2VisionTransformerPretrainedModel.from_pretrained(checkpoints["qwen2_vl"])
    ours = load_encoder(checkpoints["qwen2_vl"], device=CPU, dtype=torch.float32)
    stored = load_file(str(checkpoints["qwen2_vl"] / "model.safetensors"))["visual.blocks.0.mlp.fc1.weight"]
    assert not torch.equal(naive.blocks[0].mlp.fc1.weight, stored)
    assert torch.equal(ours.module.blocks[0].mlp.fc1.weight, stored)


def test_language_model_is_never_loaded(checkpoints: dict[str, Path]) -> None:
    for name in ("qwen2_vl", "internvl"):
        adapter = load_encoder(checkpoints[name], device=CPU, dtype=torch.float32)
        names = [param for param, _ in adapter.module.named_parameters()]
        assert names and not any("language_model" in n or "lm_head" in n or "embed_tokens" in n for n in names)


def test_unknown_family_and_missing_files(tmp_path: Path, checkpoints: dict[str, Path]) -> None:
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(CheckpointError, match="not supported"):
        load_encoder(tmp_path / "llama", device=CPU, dtype=torch.float32)
    with pytest.raises(CheckpointError, match=r"does not exist"):
        load_encoder(tmp_path / "nowhere", device=CPU, dtype=torch.float32)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        load_encoder(tmp_path / "empty", device=CPU, dtype=torch.float32)
    no_processor = tmp_path / "no-processor"
    shutil.copytree(checkpoints["clip"], no_processor)
    (no_processor / "preprocessor_config.json").unlink()
    with pytest.raises(CheckpointError, match=r"preprocessor_config\.json"):
        load_encoder(no_processor, device=CPU, dtype=torch.float32)


def _weights_digest(directory: Path) -> str:
    tensors = load_file(str(directory / "model.safetensors"))
    hasher = blake3.blake3()
    for name in sorted(tensors, key=lambda key: key.removeprefix("model.")):
        hasher.update(name.removeprefix("model.").encode())
        hasher.update(tensors[name].contiguous().view(torch.uint8).numpy())
    return hasher.hexdigest(length=16)


# Recorded from the tiny builder: a change here means every tiny checkpoint, and the embedded
# default model's outputs, changed (a new numpy/torch/transformers drew or named weights differently).
GOLDEN_DIGESTS = {"qwen2_vl": "fe744e3fa87631caad03a8733dac3bce", "internvl": "0ea9841a43c0fb4f21b7a7a0a51f55bb"}


@pytest.mark.parametrize("family", sorted(GOLDEN_DIGESTS))
def test_tiny_checkpoints_are_deterministic(family: str, tmp_path: Path) -> None:
    first = _weights_digest(build_tiny(tmp_path / "a", family))
    assert first == _weights_digest(build_tiny(tmp_path / "b", family))
    assert first == GOLDEN_DIGESTS[family]
