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
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import blake3
import torch
from safetensors import safe_open

from mmencode.models.errors import CheckpointError

__all__ = [
    "FusedQKV",
    "KeyMap",
    "load_config_json",
    "load_encoder_weights",
    "renamed",
    "rotary_halves",
    "rotary_reordered",
    "transformers4_layout",
    "weight_files",
]


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


@dataclass(frozen=True)
class KeyMap:
    """Where a module's tensors sit in a checkpoint saved in another layout (e.g. OpenGVLab's InternVL).

    ``source`` maps a module tensor name to its checkpoint key and, for fused tensors (one ``qkv``
    for three projections), which of ``parts`` equal chunks along dim 0 it is. ``roots`` are the
    checkpoint prefixes that belong to the encoder: any tensor under them that no module tensor
    reads is an error, as is any module parameter the checkpoint lacks. ``transform`` (module tensor
    name, stored tensor, the module being filled) -> module tensor reorders what a layout stores
    differently (e.g. q/k rows interleaved for rotary embeddings).
    """

    roots: tuple[str, ...]
    source: Callable[[str], tuple[str, int | None]]
    parts: int = 3
    name: str = "mapped layout"
    transform: Callable[[str, torch.Tensor, torch.nn.Module], torch.Tensor] | None = None


def transformers4_layout(*roots: str, tower: str = "vision_tower.", inner: str = "vision_model.") -> KeyMap:
    """A LLaVA-style VLM as transformers 4 saved it (the layout of most hub repos): no ``model.`` level,
    and the SigLIP/CLIP tower keeps its own ``vision_model.`` level (``vision_tower.vision_model.encoder...``),
    which transformers 5's towers dropped."""

    def source(name: str) -> tuple[str, int | None]:
        if name.startswith(tower):
            return tower + inner + name.removeprefix(tower), None
        return name, None

    return KeyMap(roots=(tower, *roots), source=source, name="transformers 4 layout")


def renamed(key: str, renames: Sequence[tuple[str, str]]) -> str:
    """``key`` with each of this layout's ``(ours, theirs)`` name pieces replaced, in order."""
    for ours, theirs in renames:
        key = key.replace(ours, theirs)
    return key


@dataclass(frozen=True)
class FusedQKV:
    """A layout that stores the three attention projections as one tensor.

    ``projections`` matches the module's ``q``/``k``/``v`` projection names (group 1: which; group 2:
    ``weight`` or ``bias``) after the layout's renames; ``fused`` is the stored name, with ``{kind}``
    for ``weight`` or ``bias``.
    """

    projections: re.Pattern[str]
    fused: str

    def locate(self, key: str) -> tuple[str, int | None]:
        """The stored key, and which third of the fused tensor it is (``None``: not a projection)."""
        match = self.projections.search(key)
        if match is None:
            return key, None
        return key[: match.start()] + self.fused.format(kind=match.group(2)), "qkv".index(match.group(1))


def rotary_reordered(projections: str, tower: str) -> Callable[[str, torch.Tensor, torch.nn.Module], torch.Tensor]:
    """A ``KeyMap.transform`` for layouts that interleave q/k rows for complex rotary embeddings:
    tensors whose names match ``projections`` are put back into halves (:func:`rotary_halves`), with the
    head count of the module's ``tower`` attribute."""
    pattern = re.compile(projections)

    def transform(name: str, tensor: torch.Tensor, module: torch.nn.Module) -> torch.Tensor:
        if not pattern.search(name):
            return tensor
        heads = int(getattr(module, tower).config.num_attention_heads)
        return rotary_halves(tensor, heads)

    return transform


def rotary_halves(tensor: torch.Tensor, heads: int) -> torch.Tensor:
    """q/k rows stored interleaved per head for complex rotary embeddings, reordered into the halves
    transformers' rotate-half rotary reads (what its ``PermuteForRope`` does when loading such repos)."""
    rows = tensor.shape[0]
    half = rows // heads // 2
    rest = tensor.shape[1:]
    return tensor.reshape(heads, half, 2, *rest).transpose(1, 2).reshape(rows, *rest)


def _under_prefix(prefix: str, top_level: set[str]) -> KeyMap:
    return KeyMap(
        roots=tuple(sorted(f"{prefix}{top}." for top in top_level)),
        source=lambda name: (prefix + name, None),
        name=f"prefix {prefix or '<none>'!r}",
    )


def _pick_layout(parameters: set[str], keys: Iterable[str], layouts: Sequence[KeyMap]) -> KeyMap:
    """The candidate layout under which most of the module's parameters are found."""
    key_set = set(keys)
    scores = [sum(layout.source(name)[0] in key_set for name in parameters) for layout in layouts]
    best = max(range(len(layouts)), key=lambda i: scores[i])
    if scores[best] == 0:
        raise CheckpointError(
            "no encoder weights found: none of the layouts "
            f"{[layout.name for layout in layouts]} matches this checkpoint's tensor names"
        )
    return layouts[best]


def load_encoder_weights(
    module: torch.nn.Module,
    checkpoint: Path,
    prefixes: Sequence[str],
    hasher: blake3.blake3,
    key_maps: Sequence[KeyMap] = (),
) -> str:
    """Fill ``module`` from ``checkpoint``; returns the layout used. Feeds every tensor to ``hasher``.

    ``prefixes`` are the places the encoder may sit in a checkpoint (``"model.visual."`` in a full
    Qwen2-VL save, ``""`` in a standalone tower); ``key_maps`` describe other layouts (transformers 4
    hub saves, OpenGVLab's). The layout that holds most of the module's parameters is used. Missing
    parameters and unknown tensors under the encoder's own roots are errors; persistent buffers the
    file lacks keep their constructed values (they are derived from the config, e.g. position ids).
    """
    files = weight_files(checkpoint)
    keys = _checkpoint_keys(files)
    state = module.state_dict()
    parameters = {name for name, _ in module.named_parameters()}
    top_level = {name.split(".", 1)[0] for name in state}
    layout = _pick_layout(parameters, keys, [*(_under_prefix(p, top_level) for p in prefixes), *key_maps])

    sources = {name: layout.source(name) for name in state}
    sources = {name: source for name, source in sources.items() if source[0] in keys}
    read = {key for key, _ in sources.values()}
    unexpected = sorted(key for key in keys if key.startswith(layout.roots) and key not in read)
    missing = sorted(parameters - set(sources))
    if missing or unexpected:
        raise CheckpointError(
            f"encoder weights under {layout.name} do not fit the model built from config.json: "
            f"{len(missing)} missing (e.g. {missing[:5]}), {len(unexpected)} unexpected (e.g. {unexpected[:5]})"
        )

    with contextlib.ExitStack() as stack:
        handles = {file: stack.enter_context(safe_open(str(file), framework="pt")) for file in files}
        # One global name order, so the fingerprint does not depend on how the tensors are sharded.
        for name in sorted(sources):
            key, part = sources[name]
            tensor = handles[keys[key]].get_tensor(key)
            if part is not None:
                tensor = tensor.chunk(layout.parts, dim=0)[part]
            if layout.transform is not None:
                tensor = layout.transform(name, tensor, module)
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
    return layout.name
