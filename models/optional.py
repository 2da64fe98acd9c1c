"""Optional dependencies some families need, checked before any weight is read.

transformers implements the image processors of Step3 (``step3p7``) and Kimi (``kimi_k25``) only on
its torchvision backend. Where torchvision is not importable (it is not installed, or it was built for
another torch), such a checkpoint is refused with one clear sentence instead of an ImportError deep
inside preprocessing. Torch-free on purpose: ``mmencode serve`` asks before it starts the server.
"""

from __future__ import annotations

import functools
import importlib

from mmencode.models.errors import CheckpointError

__all__ = ["require_torchvision", "require_torchvision_backend", "torchvision_problem"]

INSTALL_HINT = "install the matching pair, e.g. `pip install torch==2.14.1 torchvision==0.29.1`"


@functools.cache
def torchvision_problem() -> str | None:
    """Why torchvision cannot be used in this process, or ``None`` when it imports."""
    try:
        importlib.import_module("torchvision")
    except Exception as exc:  # a torchvision built for another torch fails with RuntimeError, not ImportError
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return None


def _message(model_type: str, problem: str) -> str:
    return (
        f"model_type {model_type!r} needs torchvision (transformers implements its image processor only "
        f"with torchvision), which is not importable here ({problem}); {INSTALL_HINT}"
    )


def require_torchvision(model_type: str) -> None:
    """Raise :class:`CheckpointError` naming torchvision when this family cannot preprocess here."""
    problem = torchvision_problem()
    if problem is not None:
        raise CheckpointError(_message(model_type, problem))


def require_torchvision_backend(model_type: str, backend: str) -> None:
    """Refuse ``--image-processor-backend pil`` for a family that has no PIL image processor."""
    if backend != "torchvision":
        raise CheckpointError(
            f"model_type {model_type!r} has no PIL image processor in transformers, only a torchvision one: "
            f"serve it with --image-processor-backend torchvision (or auto), not {backend}"
        )
