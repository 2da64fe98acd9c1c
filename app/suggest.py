"""The one "did you mean ...?" helper: a misspelt name to the name it most likely meant.

Used for ``MMENCODE_*`` variables (app/config.py) and for unknown request fields (app/engine/errors.py).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["did_you_mean"]


def did_you_mean(name: str, known: Iterable[str]) -> str | None:
    """The known name closest to ``name`` (case-insensitive), or ``None`` if none is close."""
    by_folded = {candidate.casefold(): candidate for candidate in known}
    close = difflib.get_close_matches(name.casefold(), list(by_folded), n=1)
    return by_folded[close[0]] if close else None
