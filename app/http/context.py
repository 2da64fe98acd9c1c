"""One request's context: its id, what its access line reports, and how its errors name its items.

The middleware (app/http/middleware.py) creates it as the request comes in, in the ASGI scope's state;
routes fill in what they learn (items, tokens, the upstream asked), a router's dependency sets the
error locator, and the error renderer records the code. Typed, in one place, instead of loose
``request.state`` attributes set in several files.
"""

from __future__ import annotations

import uuid
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any

from mmencode.app.http.locators import ENCODE_LOCATOR, ErrorLocator

__all__ = ["RequestContext", "context_of"]

_KEY = "mmencode"


@dataclass(slots=True)
class RequestContext:
    # The client's X-Request-ID when it sent a usable one (the middleware decides), else a fresh one.
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    items: int | None = None  # what the answer holds, for the access line
    tokens: int | None = None
    error_code: str | None = None  # set when the answer is an error
    upstream: str | None = None  # the chat front door's upstream(s) asked
    locator: ErrorLocator = ENCODE_LOCATOR  # how errors name this API's items
    # The cache scope of the request's tenant (--cache-scope tenant; app/http/auth.py); None: the shared one.
    cache_scope: str | None = None


def context_of(scope: MutableMapping[str, Any] | Any) -> RequestContext:
    """The context of the request whose ASGI scope (or Starlette request) this is; created if absent
    (an app run without its middleware, in a test)."""
    scope = getattr(scope, "scope", scope)
    state = scope.setdefault("state", {})
    context = state.get(_KEY)
    if context is None:
        context = state[_KEY] = RequestContext()
    assert isinstance(context, RequestContext)
    return context
