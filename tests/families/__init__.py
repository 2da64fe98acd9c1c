"""What transformers itself says about each family, for the family tests to compare the service against.

Per family: the rows the full ``...ForConditionalGeneration`` model splices into ``inputs_embeds`` for
each image (its own ``get_image_features``, plus whatever the model adds around them), the number of
placeholder tokens the family's own processor writes for each image (its ``replace_image_token`` and
friends, called on the real processor class), and a checkpoint whose processor disagrees with its model.

Several whole-processor classes cannot be instantiated without torchvision (they bundle a video
processor), so their counting methods are called on an instance built without ``__init__`` that holds
only the image processor and the token strings: the code that counts is still the processor's own.

Step3 and Kimi cannot run at all without torchvision: their parameters carry the ``torchvision``
marker, and skip with the reason where it does not import; under CI (``CI`` set), where the main
environment holds torchvision, they run and fail instead.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from mmencode.models.catalog import TINY_FAMILIES, TORCHVISION_MODEL_TYPES
from mmencode.models.optional import torchvision_problem
from tests.families import internvl, llava, qwen, step3_kimi
from tests.families.common import FamilySpec, bare_processor, tiny_tokenizer
from tests.families.internvl import opengvlab_to_transformers

__all__ = [
    "COVERED_BY_AUDIO_TESTS",
    "COVERED_BY_EQUIVALENCE",
    "FAMILIES",
    "FamilySpec",
    "bare_processor",
    "family_params",
    "needs_torchvision",
    "opengvlab_to_transformers",
    "tiny_tokenizer",
]

FAMILIES: dict[str, FamilySpec] = {**qwen.SPECS, **llava.SPECS, **internvl.SPECS, **step3_kimi.SPECS}

_PROBLEM = torchvision_problem()
needs_torchvision = [
    pytest.mark.torchvision,
    pytest.mark.skipif(
        _PROBLEM is not None and not os.environ.get("CI"),
        reason=f"needs torchvision (`make` installs the torch/torchvision pair): {_PROBLEM}",
    ),
]


# Families whose references are older and live in tests/unit/models/test_equivalence.py (the whole tower against
# transformers', on the same images), not in a FamilySpec.
COVERED_BY_EQUIVALENCE = ("clip", "internvl", "qwen2_vl", "siglip")
# Audio-only families: their references (the whole model on the family's processor, per clip) live in
# tests/contract/test_audio.py; an image spec has nothing to give them.
COVERED_BY_AUDIO_TESTS = ("qwen2_5_omni", "qwen2_audio", "qwen3_omni_moe")


def family_params() -> list[Any]:
    """Every family the catalog can build tiny, as a pytest parameter; the torchvision-only ones marked
    (and skipped without it). A family added to the catalog without a spec fails here."""
    params: list[Any] = []
    for name in TINY_FAMILIES:
        if name in COVERED_BY_EQUIVALENCE or name in COVERED_BY_AUDIO_TESTS:
            continue
        if name not in FAMILIES:
            raise LookupError(f"{name} is in models/catalog.py but has no FamilySpec in tests/families")
        params.append(pytest.param(name, marks=needs_torchvision) if name in TORCHVISION_MODEL_TYPES else name)
    return params
