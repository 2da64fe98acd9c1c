"""Which of transformers' two image-processor implementations preprocesses: PIL or torchvision.

transformers 5 implements most image processors twice: ``XxxImageProcessorPil`` on PIL and numpy, and
``XxxImageProcessor`` on torchvision. ``AutoImageProcessor`` and vLLM take the torchvision one whenever
torchvision imports. The two resample differently (pixel values apart by up to ~0.2 on one image), so
rows made with one are not the rows a language server on the other computes for the same image:
``auto`` chooses as they do, and the backend is part of every content hash.
"""

from __future__ import annotations

import logging
from typing import Literal

import transformers

from mmencode.models.errors import CheckpointError
from mmencode.models.optional import INSTALL_HINT, torchvision_problem

logger = logging.getLogger("mmencode.models")

__all__ = ["Backend", "BackendChoice", "processor_class_for", "resolve_backend"]

Backend = Literal["pil", "torchvision"]
BackendChoice = Literal["auto", "pil", "torchvision"]


def resolve_backend(choice: BackendChoice) -> Backend:
    """The backend ``choice`` means in this process; ``torchvision`` where it cannot import is refused."""
    problem = torchvision_problem()
    if choice == "auto":
        if problem is None:
            return "torchvision"
        # Loudly: the rows now differ from what the servers they feed compute with their default processors.
        logger.warning(
            "torchvision is not importable (%s): preprocessing with transformers' PIL image processors, whose rows "
            "differ from transformers' default (torchvision) ones, and so from vLLM's and SGLang's own answers; %s",
            problem,
            INSTALL_HINT,
        )
        return "pil"
    if choice == "torchvision" and problem is not None:
        raise CheckpointError(
            f"--image-processor-backend torchvision needs torchvision, which is not importable here ({problem}); "
            f"{INSTALL_HINT}, or use --image-processor-backend pil"
        )
    return choice


def processor_class_for(pil_class: type, backend: Backend) -> type:
    """The class of ``backend`` implementing the same processor as ``pil_class`` (``XxxImageProcessorPil``)."""
    if backend == "pil":
        return pil_class
    name = pil_class.__name__.removesuffix("Pil")
    torchvision_class = getattr(transformers, name, None)
    if name == pil_class.__name__ or not isinstance(torchvision_class, type):
        raise CheckpointError(f"transformers has no torchvision counterpart of {pil_class.__name__}")
    return torchvision_class
