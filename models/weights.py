"""Load only the encoder's weights out of a ``save_pretrained`` directory, strictly.

A vision class's ``from_pretrained`` pointed at a full VLM checkpoint can "succeed" with every weight
randomly initialised, reporting the mismatch only in a load report. Here the module is built from its
config and filled from the safetensors files under the one key prefix that matches it; any weight the
module needs and the file lacks, or any tensor under the encoder's prefix the module does not know,
fails the load. Language-model tensors are never read.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import blake3
import torch
from safetensors import safe_open

from models.errors import CheckpointError

__all__ = ["KeyMap", "load_config_json", "load_encoder_weights", "weight_files"]


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
    raise CheckpointError(f"{checkpoint} has no model.safetensors (only safetensors checkpoints are loaded)")


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


@dataclass(frozen=True)
class KeyMap:
    """Where a module's tensors sit in a checkpoint saved in another layout (e.g. OpenGVLab's InternVL).

    ``source`` maps a module tensor name to its checkpoint key and, for fused tensors (one ``qkv``
    for three projections), which of ``parts`` equal chunks along dim 0 it is. ``roots`` are the
    checkpoint prefixes that belong to the encoder: any tensor under them that no module tensor
    reads is an error, as is any module parameter the checkpoint lacks.
    """

    roots: tuple[str, ...]
    source: Callable[[str], tuple[str, int | None]]
    parts: int = 3


def load_encoder_weights(
    module: torch.nn.Module,
    checkpoint: Path,
    prefixes: Sequence[str],
    hasher: blake3.blake3,
    key_map: KeyMap | None = None,
) -> str:
    """Fill ``module`` from ``checkpoint``; returns the key prefix used. Feeds every tensor to ``hasher``.

    ``prefixes`` are the places the encoder may sit in a checkpoint (``"model.visual."`` in a full
    Qwen2-VL save, ``""`` in a standalone tower). Missing parameters and unknown tensors under the
    encoder's own top-level modules are errors; persistent buffers the file lacks keep their
    constructed values (they are derived from the config, e.g. position ids). With a ``key_map`` the
    names come from it instead of a prefix.
    """
    files = weight_files(checkpoint)
    keys = _checkpoint_keys(files)
    state = module.state_dict()
    parameters = {name for name, _ in module.named_parameters()}
    sources: dict[str, tuple[str, int | None]]
    if key_map is None:
        prefix = _pick_prefix(set(state), keys, prefixes)
        top_level = {name.split(".", 1)[0] for name in state}
        sources = {
            key[len(prefix) :]: (key, None)
            for key in keys
            if key.startswith(prefix) and key[len(prefix) :].split(".", 1)[0] in top_level
        }
        unexpected = sorted(set(sources) - set(state))
    else:
        prefix = ""
        sources = {name: key_map.source(name) for name in state}
        sources = {name: source for name, source in sources.items() if source[0] in keys}
        read = {key for key, _ in sources.values()}
        unexpected = sorted(key for key in keys if key.startswith(key_map.roots) and key not in read)
    missing = sorted(parameters - set(sources))
    if missing or unexpected:
        where = f"under prefix {prefix or '<none>'!r}" if key_map is None else f"under {list(key_map.roots)}"
        raise CheckpointError(
            f"encoder weights {where} do not fit the model built from config.json: "
            f"{len(missing)} missing (e.g. {missing[:5]}), {len(unexpected)} unexpected (e.g. {unexpected[:5]})"
        )

    with contextlib.ExitStack() as stack:
        handles = {file: stack.enter_context(safe_open(str(file), framework="pt")) for file in files}
        # One global name order, so the fingerprint does not depend on how the tensors are sharded.
        for name in sorted(n for n in sources if n in state):
            key, part = sources[name]
            tensor = handles[keys[key]].get_tensor(key)
            if part is not None:
                assert key_map is not None
                tensor = tensor.chunk(key_map.parts, dim=0)[part]
            target = state[name]
            if tensor.shape != target.shape:
                raise CheckpointError(
                    f"weight {key} has shape {list(tensor.shape)}, "
                    f"the model built from config.json expects {list(target.shape)}"
                )
            hasher.update(name.encode())
            hasher.update(tensor.contiguous().reshape(-1).view(torch.uint8).numpy())
            with torch.no_grad():
                target.copy_(tensor)
    return prefix
