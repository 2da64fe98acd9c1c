"""Checkpoints as the hub repos hold them (saved by transformers 4), loaded as transformers 5 loads them.

Each tiny checkpoint is rewritten into its hub layout (no ``model.`` level, the SigLIP tower under
``vision_tower.vision_model.``, the language model under ``language_model.model.``) with the hub's
processor files; transformers' own ``from_pretrained`` converts that layout on load and is the reference.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import Gemma3ForConditionalGeneration

from mmencode.models import load_encoder
from tests.families import FAMILIES
from tests.helpers import noise_image

CPU = torch.device("cpu")
IMAGES = [noise_image(120, 90, seed=1), noise_image(64, 200, seed=2), noise_image(300, 160, seed=3)]


def _to_hub_layout(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    renamed: dict[str, torch.Tensor] = {}
    for key, tensor in load_file(str(dst / "model.safetensors")).items():
        inner = key.removeprefix("model.")
        if inner.startswith("vision_tower."):
            key = "vision_tower.vision_model." + inner.removeprefix("vision_tower.")
        elif inner.startswith("language_model."):
            key = "language_model.model." + inner.removeprefix("language_model.")
        elif key == "lm_head.weight":
            key = "language_model.lm_head.weight"
        else:
            key = inner
        renamed[key] = tensor
    save_file(renamed, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_gemma3_as_the_hub_repos_ship_it(tiny_checkpoint: Callable[..., Path], tmp_path: Path) -> None:
    hub = _to_hub_layout(tiny_checkpoint("gemma3"), tmp_path / "gemma-3")
    image_processor = json.loads((hub / "processor_config.json").read_text())["image_processor"]
    # google/gemma-3-*: nulls where the processor's defaults apply (pan-and-scan off), and a
    # processor_config.json holding only image_seq_length.
    image_processor.update(
        do_convert_rgb=None,
        do_pan_and_scan=None,
        pan_and_scan_max_num_crops=None,
        pan_and_scan_min_crop_size=None,
        pan_and_scan_min_ratio_to_activate=None,
        image_seq_length=16,
        processor_class="Gemma3Processor",
    )
    (hub / "preprocessor_config.json").write_text(json.dumps(image_processor))
    (hub / "processor_config.json").write_text(
        json.dumps({"image_seq_length": 16, "processor_class": "Gemma3Processor"})
    )
    assert any(key.startswith("vision_tower.vision_model.") for key in load_file(str(hub / "model.safetensors")))

    adapter = load_encoder(hub, device=CPU, dtype=torch.float32)
    items = [adapter.preprocess(image) for image in IMAGES]
    assert [(item.num_tokens, item.metadata) for item in items] == [(16, {"num_crops": 0})] * 3
    assert adapter.tokens_from_metadata({}) == 16  # no crops: nothing a precomputed item must carry
    ours = torch.split(adapter.forward(items).rows, 16)

    inputs = adapter.processor(images=IMAGES, return_tensors="pt")
    model = Gemma3ForConditionalGeneration.from_pretrained(hub).eval()
    with torch.inference_mode():
        reference = model.model.get_image_features(inputs["pixel_values"]).pooler_output
    for got, want in zip(ours, reference, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_llava_onevision_as_the_llava_hf_repos_ship_it(tiny_checkpoint: Callable[..., Path], tmp_path: Path) -> None:
    hub = _to_hub_layout(tiny_checkpoint("llava_onevision"), tmp_path / "llava-onevision")
    keys = set(load_file(str(hub / "model.safetensors")))
    assert "image_newline" in keys and any(k.startswith("vision_tower.vision_model.") for k in keys)

    adapter = load_encoder(hub, device=CPU, dtype=torch.float32)
    prepared = [adapter.preprocess(image) for image in IMAGES]
    ours = torch.split(adapter.forward(prepared).rows, [p.num_tokens for p in prepared])
    # transformers loads the hub layout itself (its conversion mapping) for the reference.
    reference = FAMILIES["llava_onevision"].reference(hub, IMAGES, adapter)
    for got, want in zip(ours, reference, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
