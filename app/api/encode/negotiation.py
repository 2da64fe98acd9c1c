"""Which representation of a ``/v1/encode`` answer the ``Accept`` header asks for (RFC 9110, 12.5.1).

Offered: JSON (the default) and the safetensors container, under its own media type or as
``application/octet-stream``. Each offered type takes the quality of the most specific range that
matches it (``type/subtype`` over ``type/*`` over ``*/*``); the highest quality wins, then the
more specific match, then JSON. A header that matches none of them is disregarded (JSON), as the
RFC allows, rather than answered 406: a client that sent ``Accept: text/html`` still gets an answer.
"""

from __future__ import annotations

__all__ = ["BINARY_MEDIA_TYPES", "JSON_MEDIA_TYPE", "SAFETENSORS_MEDIA_TYPE", "negotiate"]

JSON_MEDIA_TYPE = "application/json"
SAFETENSORS_MEDIA_TYPE = "application/vnd.safetensors"
BINARY_MEDIA_TYPES = (SAFETENSORS_MEDIA_TYPE, "application/octet-stream")
_OFFERED = (JSON_MEDIA_TYPE, *BINARY_MEDIA_TYPES)  # in order of preference on a tie


def negotiate(accept: str | None) -> str:
    """The offered media type ``accept`` prefers; JSON when it is absent, empty or matches nothing."""
    ranges = _parse(accept or "")
    best, best_key = JSON_MEDIA_TYPE, (0.0, -1, 0)
    for order, offered in enumerate(_OFFERED):
        match = _quality(offered, ranges)
        if match is None or match[0] <= 0:
            continue
        key = (match[0], match[1], -order)
        if key > best_key:
            best, best_key = offered, key
    return best


def _parse(accept: str) -> list[tuple[str, str, float]]:
    """``(type, subtype, q)`` for each well-formed range; a malformed one is skipped."""
    ranges = []
    for part in accept.split(","):
        media, *params = (piece.strip() for piece in part.split(";"))
        kind, slash, subtype = media.lower().partition("/")
        if not slash or not kind or not subtype or (kind == "*" and subtype != "*"):
            continue
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value.strip())
                except ValueError:
                    q = -1.0
        if 0.0 <= q <= 1.0:
            ranges.append((kind, subtype, q))
    return ranges


def _quality(offered: str, ranges: list[tuple[str, str, float]]) -> tuple[float, int] | None:
    """``(q, specificity)`` of the most specific range matching ``offered``, or ``None``."""
    kind, _, subtype = offered.partition("/")
    found: tuple[float, int] | None = None
    for range_kind, range_subtype, q in ranges:
        if (range_kind, range_subtype) == (kind, subtype):
            specificity = 2
        elif (range_kind, range_subtype) == (kind, "*"):
            specificity = 1
        elif (range_kind, range_subtype) == ("*", "*"):
            specificity = 0
        else:
            continue
        if found is None or specificity > found[1]:
            found = (q, specificity)
    return found
