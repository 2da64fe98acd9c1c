"""Load only the encoder's weights out of a ``save_pretrained`` directory, strictly.

A vision class's ``from_pretrained`` pointed at a full VLM checkpoint can "succeed" with every weight
randomly initialised, reporting the mismatch only in a load report. Here the module is built from its
config and filled from the safetensors files under the one key prefix that matches it; any weight the
module needs and the file lacks, or any tensor under the encoder's prefix the module does not know,
fails the load. Language-model tensors are never read.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import blake3
import torch
from safetensors import safe_open

from models.errors import CheckpointError

__all__ = ["load_config_json", "load_encoder_weights", "weight_files"]


def load_config_json(checkpoint: Path) -> dict[str, object]:
    path = checkpoint / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{checkpoint} has no config.json: not a save_pretrained directory")
    config: dict[str, object] = json.loads(path.read_text())
    return config


def weight_files(checkpoint: Path) -> list[Path]:
    """The safetensors files of a checkpoint, single-file or sharded."""
    index = checkpoint / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [checkpoint / shard for shard in shards]
    single = checkpoint / "model.safetensors"
    if single.is_file():
        return [single]
    if any(checkpoint.glob("*.bin")) or any(checkpoint.glob("*.pt")):
        raise CheckpointError(
            f"{checkpoint} has only pickled weights (*.bin / *.pt); only safetensors checkpoints are loaded: "
            "download the model's safetensors files, or convert with save_pretrained(safe_serialization=True)"
        )
    raise CheckpointError(f"{checkpoint} has no model.safetensors: no weights to load (only safetensors are loaded)")


def _checkpoint_keys(files: Iterable[Path]) -> dict[str, Path]:
    keys: dict[str, Path] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                keys[key] = file
    return keys


def _pick_prefix(expected: set[str], keys: Iterable[str], prefixes: Sequence[str]) -> str:
    """The candidate prefix under which most of the module's weights are found."""
    key_set = set(keys)
    scores = {prefix: sum(prefix + name in key_set for name in expected) for prefix in prefixes}
    best = max(prefixes, key=lambda prefix: scores[prefix])
    if scores[best] == 0:
        raise CheckpointError(
            "no encoder weights found: none of the prefixes "
            f"{[p or '<none>' for p in prefixes]} matches this checkpoint's tensor names"
        )
    return best


def load_encoder_weights(
    module: torch.nn.Module, checkpoint: Path, prefixes: Sequence[str], hasher: blake3.blake3
) -> str:
    """Fill ``module`` from ``checkpoint``; returns the key prefix used. Feeds every tensor to ``hasher``.

    ``prefixes`` are the places the encoder may sit in a checkpoint (``"model.visual."`` in a full
    Qwen2-VL save, ``""`` in a standalone tower). Missing parameters and unknown tensors under the
    encoder's own top-level modules are errors; persistent buffers the file lacks keep their
    constructed values (they are derived from the config, e.g. position ids).
    """
    files = weight_files(checkpoint)
    keys = _checkpoint_keys(files)
    state = module.state_dict()
    parameters = {name for name, _ in module.named_parameters()}
    prefix = _pick_prefix(set(state), keys, prefixes)

    top_level = {name.split(".", 1)[0] for name in state}
    ours = {
        key[len(prefix) :]: key
        for key in keys
        if key.startswith(prefix) and key[len(prefix) :].split(".", 1)[0] in top_level
    }
    missing = sorted(parameters - set(ours))
    unexpected = sorted(set(ours) - set(state))
    if missing or unexpected:
        raise CheckpointError(
            f"encoder weights under prefix {prefix or '<none>'!r} do not fit the model built from config.json: "
            f"{len(missing)} missing (e.g. {missing[:5]}), {len(unexpected)} unexpected (e.g. {unexpected[:5]})"
        )

    by_file: dict[Path, list[str]] = {}
    for name in sorted(ours):
        by_file.setdefault(keys[ours[name]], []).append(name)
    for file, names in by_file.items():
        with safe_open(str(file), framework="pt") as handle:
            for name in names:
                tensor = handle.get_tensor(ours[name])
                target = state[name]
                if tensor.shape != target.shape:
                    raise CheckpointError(
                        f"weight {ours[name]} has shape {list(tensor.shape)}, "
                        f"the model built from config.json expects {list(target.shape)}"
                    )
                hasher.update(name.encode())
                hasher.update(tensor.contiguous().reshape(-1).view(torch.uint8).numpy())
                with torch.no_grad():
                    target.copy_(tensor)
    return prefix
