"""Assembles the application: ``create_app(settings)`` is the only place serving objects are built.

It changes nothing outside the app (GC, the event loop's executor, other threads' torch settings):
process-wide tuning is `mmencode serve`'s (app/cli.py), so several apps can live in one process.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from mmencode.app.services import EmbeddingsService, EncodeService

__all__ = ["create_app"]


def create_app(settings: Settings) -> FastAPI:
    runtime = Runtime(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Load in the background: /health answers while the model loads, /ready waits for it.
        loading = asyncio.create_task(runtime.start(), name="mmencode-load")
        try:
            yield
        finally:
            if not loading.done():
                loading.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await loading
            await runtime.stop()

    # FastAPI with /docs and /redoc assets served from the installed package instead of a CDN.
    app = FastAPIOffline(
        title="mmencode",
        version=__version__,
        description="Vision-encoder embeddings for multimodal LLM serving.",
        lifespan=lifespan,
        # Swagger UI would otherwise send the schema to validator.swagger.io for its badge.
        swagger_ui_parameters={"validatorUrl": None},
    )
    app.state.settings = settings
    app.state.runtime = runtime
    app.state.metrics = runtime.metrics
    # One serving object per API; routes parse, call one of them, render.
    app.state.encode_service = EncodeService(
        runtime, memo=runtime.cache, ec_writer=runtime.ec_cache_writer, executor=runtime.io_executor
    )
    app.state.embeddings_service = EmbeddingsService(runtime)
    app.state.sglang_bridge = runtime.sglang
    # Outermost last: the request context wraps everything, the body limit sits inside it.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes, metrics=runtime.metrics)
    api_keys = settings.api_keys()
    if api_keys:
        # Outside the body limit: a request without a key is refused before its body is read.
        app.add_middleware(ApiKeyMiddleware, keys=api_keys, metrics=runtime.metrics)
    app.add_middleware(RequestContextMiddleware, metrics=runtime.metrics)
    install_error_handlers(app)
    routers = (encode.router, embeddings.router, health.router, sglang_routes.router)
    for router in routers:
        app.include_router(router)
    install_openapi(app, routers, bearer_protected=is_protected if api_keys else None)
    return app
