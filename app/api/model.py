"""What a serving object needs of the loaded model: its name, its scheduler, and the model check."""

from __future__ import annotations

from typing import Protocol

from mmencode.app.engine.scheduler import Scheduler

__all__ = ["ServedModel"]


class ServedModel(Protocol):
    """The runtime, as the services see it (``app.engine.engine.Runtime`` implements it)."""

    @property
    def model_name(self) -> str: ...

    @property
    def started_at(self) -> int: ...

    @property
    def scheduler(self) -> Scheduler:
        """The loaded model's scheduler; raises ``NotReady`` (503) until it is loaded and warm."""
        ...

    @property
    def image_processor_backend(self) -> str | None:
        """``pil`` or ``torchvision`` once loaded; ``None`` before."""
        ...

    def check_model(self, requested: str | None) -> None:
        """Raise ``ModelNotFound`` unless ``requested`` is absent or the served model's name."""
        ...
