"""What transformers itself says about each family, for the family tests to compare the service against.

Per family: the rows the full ``...ForConditionalGeneration`` model splices into ``inputs_embeds`` for
each image (its own ``get_image_features``, plus whatever the model adds around them), the number of
placeholder tokens the family's own processor writes for each image (its ``replace_image_token`` and
friends, called on the real processor class), and a checkpoint whose processor disagrees with its model.

Several whole-processor classes cannot be instantiated without torchvision (they bundle a video
processor), so their counting methods are called on an instance built without ``__init__`` that holds
only the image processor and the token strings: the code that counts is still the processor's own.
"""

from __future__ import annotations

from tests.families import internvl, llava, qwen
from tests.families.common import FamilySpec, bare_processor, tiny_tokenizer
from tests.families.internvl import opengvlab_to_transformers

__all__ = ["FAMILIES", "FamilySpec", "bare_processor", "opengvlab_to_transformers", "tiny_tokenizer"]

FAMILIES: dict[str, FamilySpec] = {**qwen.SPECS, **llava.SPECS, **internvl.SPECS}
