"""JSON responses rendered by :func:`app.wire.json.dumps_json` (numpy arrays serialise natively)."""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from mmencode.app.wire.json import dumps_json

__all__ = ["JSONBytesResponse"]


class JSONBytesResponse(Response):
    """JSON rendered by :func:`dumps_json`; numpy arrays serialise natively."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return dumps_json(content)
