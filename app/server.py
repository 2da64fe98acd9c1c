"""The composition root: ``create_app(settings)`` is the one place the service's objects are built.

The engine side comes whole from :meth:`Engine.from_settings` (fetcher, media loader, caches, and once
the model is loaded the worker and the scheduler); the peers' writers, the chat front door's upstreams
and one service per API are built here, and the HTTP layer (middleware, error handlers, the OpenAPI
document) is wrapped around them.

It changes nothing outside the app (GC, the event loop's executor, other threads' torch settings):
process-wide tuning is ``mmencode serve``'s (app/cli.py, app/process/), so several apps can live in
one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline

from mmencode import __version__
from mmencode.app.api import health
from mmencode.app.api.chat import router as chat
from mmencode.app.api.chat.front_door import FrontDoor
from mmencode.app.api.chat.service import ChatService
from mmencode.app.api.encode import router as encode
from mmencode.app.api.encode.service import EncodeService
from mmencode.app.api.openai import router as embeddings
from mmencode.app.api.openai.service import EmbeddingsService
from mmencode.app.api.sglang import router as sglang
from mmencode.app.config import Settings
from mmencode.app.engine.cache import ResponseMemo
from mmencode.app.engine.engine import Engine, resolve_device, resolve_dtype
from mmencode.app.engine.threads import SerialTorchThreadPool
from mmencode.app.http.auth import ApiKeyMiddleware, is_protected
from mmencode.app.http.body_limit import BodyLimitMiddleware
from mmencode.app.http.errors import install_error_handlers
from mmencode.app.http.middleware import RequestContextMiddleware
from mmencode.app.http.openapi import install_openapi
from mmencode.app.metrics import Metrics
from mmencode.app.peers.sglang.bridge import SGLangEncoderBridge
from mmencode.app.peers.sglang.registration import EncoderRegistration
from mmencode.app.peers.sglang.sampling import SGLANG_FRAMES
from mmencode.app.peers.vllm.ec_writer import EncoderCacheWriter
from mmencode.app.peers.vllm.mooncake.control import ControlChannel
from mmencode.app.peers.vllm.mooncake.push import MooncakePusher
from mmencode.app.peers.vllm.mooncake.transfer import MooncakeTransfer, local_address_towards, require_mooncake

__all__ = ["create_app"]

logger = logging.getLogger("mmencode.mooncake")


def create_app(settings: Settings) -> FastAPI:
    metrics = Metrics()
    engine = Engine.from_settings(settings, metrics, frame_choices={"sglang": SGLANG_FRAMES})
    # Peers' formats: vLLM's encoder-cache files (opt-in) and SGLang's encoder protocol.
    ec_writer = (
        EncoderCacheWriter(
            settings.ec_shared_storage,
            _ec_dtype(settings),
            metrics,
            executor=engine.io_executor,
            max_bytes=settings.ec_storage_bytes,
            min_age_s=settings.ec_min_age,
        )
        if settings.ec_shared_storage is not None
        else None
    )
    sglang_bridge = SGLangEncoderBridge(
        engine.encode,
        engine.media,
        dtype=settings.sglang_dtype,
        compute_dtype=lambda: engine.info.dtype,
        push_timeout_s=settings.sglang_push_timeout,
        metrics=metrics,
    )
    # vLLM's ECMooncakeConnector: rows pushed into consumers (opt-in; Mooncake is imported only then).
    pusher = _mooncake_pusher(settings, metrics) if settings.mooncake else None
    front_door = FrontDoor.build(settings, metrics) if settings.upstream else None
    # Announced to SGLang language servers once the model is ready; withdrawn when the engine drains.
    registration = (
        EncoderRegistration(settings.sglang_register_url, settings.advertised_url())
        if settings.sglang_register_url
        else None
    )
    if registration is not None:
        engine.drain_hooks.append(registration.withdraw)

    # One service per API; routes parse, call one of them, render.
    memo = ResponseMemo(settings.response_memo_bytes)
    metrics.response_memo_bytes.set_function(lambda: float(memo.nbytes))
    encode_service = EncodeService(
        engine,
        memo=memo,
        ec_writer=ec_writer,
        pusher=pusher,
        push_consumers=settings.ec_push_consumers,
        executor=engine.io_executor,
    )
    embeddings_service = EmbeddingsService(
        engine, upstream_models=front_door.pool.models if front_door is not None else None
    )
    chat_service = (
        ChatService.start(engine, front_door, metrics, settings=settings, ec_writer=ec_writer, pusher=pusher)
        if front_door is not None
        else None
    )

    async def start() -> None:
        if ec_writer is not None:
            await ec_writer.open()  # counted (and trimmed) before the first answer names a file
        await engine.start()
        if registration is not None and engine.ready:
            registration.start()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Load in the background: /health answers while the model loads, /ready waits for it.
        loading = asyncio.create_task(start(), name="mmencode-load")
        upkeep = asyncio.create_task(ec_writer.keep_up(), name="mmencode-ec-upkeep") if ec_writer else None
        if front_door is not None:
            front_door.pool.start()
        if pusher is not None:
            # Its ports open now, and a transfer engine that cannot start says so in the log at once.
            mooncake = asyncio.create_task(_start_transfer(pusher), name="mmencode-mooncake-start")
        try:
            yield
        finally:
            if upkeep is not None:
                upkeep.cancel()
            if not loading.done():
                loading.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await loading
            await engine.stop()
            if registration is not None:
                await registration.aclose()
            if front_door is not None:
                await front_door.aclose()
            if pusher is not None:
                await mooncake
                await pusher.aclose()
            await sglang_bridge.aclose()
            await engine.fetcher.aclose()

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
    app.state.engine = engine
    app.state.metrics = metrics
    app.state.encode_service = encode_service
    app.state.embeddings_service = embeddings_service
    app.state.chat_service = chat_service
    app.state.sglang_bridge = sglang_bridge
    app.state.mooncake_pusher = pusher
    # Outermost last: the request context wraps everything, the body limit sits inside it.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes, metrics=metrics)
    api_keys = settings.api_key_tenants()
    if api_keys:
        # Outside the body limit: a request without a key is refused before its body is read.
        app.add_middleware(
            ApiKeyMiddleware, keys=api_keys, metrics=metrics, scope_by_tenant=settings.scoped_by_tenant()
        )
    app.add_middleware(RequestContextMiddleware, metrics=metrics)
    install_error_handlers(app)
    routers = (encode.router, embeddings.router, chat.router, health.router, sglang.router)
    for router in routers:
        app.include_router(router)
    install_openapi(app, routers, bearer_protected=is_protected if api_keys else None)
    return app


def _mooncake_pusher(settings: Settings, metrics: Metrics) -> MooncakePusher:
    """The pusher into ECMooncakeConnector consumers; raises MooncakeUnavailable, naming the extra, at start."""
    require_mooncake()
    consumers = settings.upstream_ec_control or [c for c in settings.ec_push_consumers if c != "*"]
    hostname = settings.mooncake_hostname
    if hostname is None:
        first = consumers[0].removeprefix("tcp://").rsplit(":", 1)[0] if consumers else "127.0.0.1"
        hostname = local_address_towards(first)
    return MooncakePusher(
        MooncakeTransfer(hostname, settings.mooncake_protocol, settings.mooncake_device),
        ControlChannel(settings.mooncake_control_timeout),
        metrics,
        timeout_s=settings.mooncake_push_timeout,
        # Its own threads: a write blocks one for as long as the bytes take, which must not hold up the I/O pool.
        executor=SerialTorchThreadPool(max_workers=4, thread_name_prefix="mmencode-mooncake"),
    )


async def _start_transfer(pusher: MooncakePusher) -> None:
    try:
        await asyncio.to_thread(pusher.transfer.start)
    except Exception:
        logger.exception("Mooncake's transfer engine did not start; every push will fail until it does")
    else:
        logger.info("Mooncake transfer engine at %s (%s)", pusher.transfer.session, pusher.transfer.protocol)


def _ec_dtype(settings: Settings) -> str:
    """The connector files' dtype: the one asked, or the dtype the encoder computes in."""
    if settings.ec_dtype != "auto":
        return settings.ec_dtype
    return str(resolve_dtype(settings.dtype, resolve_device(settings.device))).removeprefix("torch.")
