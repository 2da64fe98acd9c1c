"""Assembles the application: ``create_app(settings)`` is the only place serving objects are built."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline

from mmencode import __version__
from mmencode.app.auth import ApiKeyMiddleware, is_protected
from mmencode.app.body_limit import BodyLimitMiddleware
from mmencode.app.config import Settings
from mmencode.app.errors import install_error_handlers
from mmencode.app.middleware import RequestContextMiddleware
from mmencode.app.openapi import install_openapi
from mmencode.app.routes import embeddings, encode, health
from mmencode.app.routes import sglang as sglang_routes
from mmencode.app.runtime import Runtime

__all__ = ["create_app"]


def create_app(settings: Settings) -> FastAPI:
    runtime = Runtime(settings)

    async def load() -> None:
        await runtime.start()
        if runtime.ready:
            _freeze_loaded_objects()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Load in the background: /health answers while the model loads, /ready waits for it.
        loading = asyncio.create_task(load(), name="mmencode-load")
        try:
            yield
        finally:
            if not loading.done():
                loading.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await loading
            await runtime.stop()
            # What was frozen may be garbage now (the model, in a process that builds apps again).
            gc.unfreeze()

    # FastAPI with /docs and /redoc assets served from the installed package instead of a CDN.
    app = FastAPIOffline(
        title="mmencode",
        version=__version__,
        description="Vision-encoder embeddings for multimodal LLM serving.",
        lifespan=lifespan,
        # Swagger UI would otherwise send the schema to validator.swagger.io for its badge.
        swagger_ui_parameters={"validatorUrl": None},
    )
    app.state.runtime = runtime
    app.state.metrics = runtime.metrics
    # Outermost last: the request context wraps everything, the body limit sits inside it.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes, metrics=runtime.metrics)
    api_keys = settings.api_keys()
    if api_keys:
        # Outside the body limit: a request without a key is refused before its body is read.
        app.add_middleware(ApiKeyMiddleware, keys=api_keys, metrics=runtime.metrics)
    app.add_middleware(RequestContextMiddleware, metrics=runtime.metrics)
    install_error_handlers(app)
    app.include_router(encode.router)
    app.include_router(embeddings.router)
    app.include_router(health.router)
    app.include_router(sglang_routes.router)
    install_openapi(app, bearer_protected=is_protected if api_keys else None)
    return app


def _freeze_loaded_objects() -> None:
    """Move everything alive after loading (torch, transformers, the model: ~400k objects) out of GC's reach.

    Requests allocate enough to trigger a full collection every thousand or so; each one walked every
    object the imports and the model left behind, a 0.2-0.5 s pause of the event loop that set p99
    under load. Frozen objects are never scanned, so a full collection only sees what serving allocates.
    """
    gc.collect()
    gc.freeze()
