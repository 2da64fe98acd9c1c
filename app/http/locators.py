"""How each API names a request's items in its errors: ``items[2].image``, ``input[2]``, ``mm_items[2].url``.

The engine locates an error at an item and a field in its own names (:class:`ItemLocation`); an API's
router declares its :class:`ErrorLocator` once, and the error is rendered in that API's names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from mmencode.app.engine.errors import ItemLocation, ServiceError

__all__ = ["ENCODE_LOCATOR", "ErrorLocator"]


@dataclass(frozen=True, slots=True)
class ErrorLocator:
    """How one front end names an item and its fields, in ``param`` and at the head of the message."""

    collection: str  # "items", "input", "mm_items"
    label: str  # the message's prefix: "item {index}", "input[{index}]"
    # The scheduler's field names in this API: renamed, or None where the item itself is the field.
    fields: Mapping[str, str | None] = field(default_factory=dict)

    def param(self, location: ItemLocation) -> str:
        if location.index is None:
            return self.collection
        path = f"{self.collection}[{location.index}]"
        head, *rest = location.field
        name = self.fields.get(str(head), str(head))
        if name is None:
            return path
        for part in (name, *rest):
            path += f"[{part}]" if isinstance(part, int) else f".{part}"
        return path

    def message(self, error: ServiceError) -> str:
        location = error.location
        if location is None or location.index is None or location.named_in_message:
            return error.message
        return f"{self.label.format(index=location.index)}: {error.message}"


# /v1/encode's names, and the default for errors raised outside any front end's route.
ENCODE_LOCATOR = ErrorLocator("items", "item {index}")
