"""Step3 (``step3p7``) and Kimi (``kimi_k25``) beyond the shared family tests (tests/unit/models/test_families.py).

Both need torchvision. Where it is missing (simulated here by blocking its import, so these run in
every environment) a checkpoint is refused with one sentence naming it, by the loader and by
``mmencode serve`` before it starts; the rest runs where torchvision imports (the main environment).
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from mmencode.models import CheckpointError, MetadataError, load_encoder
from mmencode.models.optional import torchvision_problem
from mmencode.models.tiny.step3_kimi import KIMI_PROCESSOR, STEP3_PROCESSOR
from tests.families import needs_torchvision, tiny_tokenizer
from tests.families.step3_kimi import STEP3_TOKENS
from tests.helpers import noise_image

CPU = torch.device("cpu")
FAMILIES = ("step3p7", "kimi_k25")


@pytest.fixture
def without_torchvision(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``import torchvision`` fails in this process, as on a machine without it."""
    monkeypatch.setitem(sys.modules, "torchvision", None)  # None in sys.modules makes the import raise
    torchvision_problem.cache_clear()
    yield
    monkeypatch.undo()
    torchvision_problem.cache_clear()


@pytest.mark.parametrize("family", FAMILIES)
def test_without_torchvision_loading_names_it(
    family: str, tiny_checkpoint: Callable[..., Path], without_torchvision: None
) -> None:
    checkpoint = tiny_checkpoint(family)  # building the checkpoint needs no torchvision
    with pytest.raises(CheckpointError, match=rf"model_type '{family}' needs torchvision.*torchvision==0\.29\.1"):
        load_encoder(checkpoint, device=CPU, dtype=torch.float32)


# ----- where torchvision imports -----
def torchvision_only(test: Callable[..., None]) -> Callable[..., None]:
    for mark in needs_torchvision:
        test = mark(test)
    return test


@pytest.mark.parametrize("family", [pytest.param(family, marks=needs_torchvision) for family in FAMILIES])
def test_tiny_processor_settings_are_what_the_real_class_saves(
    family: str, tiny_checkpoint: Callable[..., Path]
) -> None:
    from transformers import AutoImageProcessor

    written = {"step3p7": STEP3_PROCESSOR, "kimi_k25": KIMI_PROCESSOR}[family]
    saved = AutoImageProcessor.from_pretrained(tiny_checkpoint(family)).to_dict()
    for key, value in written.items():
        got = saved[key]
        assert (list(got) if isinstance(got, tuple) else got) == value, key


def _step3(tiny_checkpoint: Callable[..., Path]):  # type: ignore[no-untyped-def]
    return load_encoder(tiny_checkpoint("step3p7"), device=CPU, dtype=torch.float32)


@torchvision_only
def test_step3_num_patches_zero_is_the_global_view_alone(tiny_checkpoint: Callable[..., Path]) -> None:
    adapter = _step3(tiny_checkpoint)
    # Tiny Step3: a 168 px global view (9 rows) and 112 px crops (4 rows each), as the 56 px stride gives.
    item = adapter.preprocess(noise_image(120, 90))  # fits the global view: no crops
    assert item.metadata == {"num_patches": 0} and item.num_tokens == 9
    assert adapter.tokens_from_metadata({"num_patches": 6}) == 6 * 4 + 9
    # Readiness waits on a warm-up forward that runs the crop path as well.
    assert adapter.preprocess(adapter.warmup_image()).metadata == {"num_patches": 2}
    for wrong in (-1, True, 1.5, "2"):
        with pytest.raises(MetadataError, match="non-negative integer") as caught:
            adapter.tokens_from_metadata({"num_patches": wrong})
        assert caught.value.field == "num_patches" and not caught.value.missing


@torchvision_only
def test_rows_for_640x480_with_the_default_processor_settings(tiny_checkpoint: Callable[..., Path]) -> None:
    """The numbers in the closing note: each family's processor class defaults, counted by its processor."""
    from transformers import Kimi_K25ImageProcessor, Step3p7ImageProcessor, Step3p7Processor

    image = noise_image(640, 480)
    step3 = _step3(tiny_checkpoint)
    step3.processor = Step3p7ImageProcessor()  # global view 728 px, crops 504 px, ViT patch 14
    item = step3.preprocess(image)
    own = Step3p7Processor(image_processor=step3.processor, tokenizer=tiny_tokenizer(**STEP3_TOKENS))
    assert item.metadata == {"num_patches": 0}  # 640 px fits the 728 px view, aspect 4:3 below 1.5
    assert item.num_tokens == own.num_image_feature_size == 169
    kimi = load_encoder(tiny_checkpoint("kimi_k25"), device=CPU, dtype=torch.float32)
    kimi.processor = Kimi_K25ImageProcessor()  # patch 14, merge 2, up to 16384 patches
    item = kimi.preprocess(image)
    # 480 x 640 padded to multiples of 28: 504 x 644 -> a 36 x 46 patch grid -> 18 x 23 rows.
    assert item.metadata == {"image_grid_thw": [1, 36, 46]} and item.num_tokens == 414


@torchvision_only
def test_kimi_repo_layout_with_the_projector_norm_at_top_level_loads_the_same(
    tiny_checkpoint: Callable[..., Path], tmp_path: Path
) -> None:
    # transformers' save_pretrained writes model.mm_projector.pre_norm.*; the repos keep mm_projector.pre_norm.*.
    saved = tiny_checkpoint("kimi_k25")
    repo = shutil.copytree(saved, tmp_path / "kimi-repo")
    tensors = load_file(str(repo / "model.safetensors"))
    moved = {name.removeprefix("model.") if ".pre_norm." in name else name: t for name, t in tensors.items()}
    assert moved.keys() != tensors.keys()
    save_file(moved, str(repo / "model.safetensors"), metadata={"format": "pt"})
    image = noise_image(300, 160)
    rows = []
    for checkpoint in (saved, repo):
        adapter = load_encoder(checkpoint, device=CPU, dtype=torch.float32)
        rows.append(adapter.forward([adapter.preprocess(image)]).rows)
    assert torch.equal(rows[0], rows[1])
    assert json.loads((repo / "config.json").read_text())["model_type"] == "kimi_k25"


def test_without_torchvision_the_pil_fallback_is_said_loudly_naming_whose_answers_differ(
    without_torchvision: None, caplog: pytest.LogCaptureFixture
) -> None:
    from mmencode.models.processor_backend import resolve_backend

    with caplog.at_level("WARNING", logger="mmencode.models"):
        assert resolve_backend("auto") == "pil"
    [record] = caplog.records
    assert record.levelname == "WARNING" and "vLLM's and SGLang's" in record.getMessage()
    assert "pip install" in record.getMessage()
