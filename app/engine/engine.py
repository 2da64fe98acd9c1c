"""The engine: what the APIs see of the encoder (``encode()``, ``info``, ``ready``), and its lifecycle.

:meth:`Engine.from_settings` builds the engine side of the service from its settings: the media
fetcher and loader, the caches, the worker and the scheduler, with the request limits. Loading happens
in the background after the HTTP server is up, so liveness answers at once while readiness waits for the
model and its warm-up forward; then the engine serves until it drains.

No API reaches past this façade into the scheduler or the adapter: they ask :meth:`Engine.encode` for
rows and read :attr:`Engine.info` for what the model is.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from mmencode.app.config import Settings
from mmencode.app.engine.cache import CacheTier, Leases, LRUEmbeddingCache, SharedCache, TieredCache
from mmencode.app.engine.compute_gate import ComputeGate, GatedThreadPool
from mmencode.app.engine.errors import ModelNotFound, NotReady
from mmencode.app.engine.scheduler import PrecomputedMode, Scheduler
from mmencode.app.engine.threads import SerialTorchThreadPool, in_executor, serial_torch_ops
from mmencode.app.engine.types import Item, ItemResult, Limits, SamplingRule
from mmencode.app.engine.worker import EncoderWorker
from mmencode.app.media.audio import AudioLimits
from mmencode.app.media.fetch import MediaFetcher
from mmencode.app.media.loader import MediaLoader
from mmencode.app.media.video import VideoLimits
from mmencode.app.metrics import Metrics
from mmencode.models import CheckpointError, EncoderAdapter, load_encoder
from mmencode.models.base import FrameChoice

__all__ = [
    "DRAIN_GRACE_S",
    "Engine",
    "EngineInfo",
    "Phase",
    "batch_token_budget",
    "batch_wait_seconds",
    "default_model_dir",
    "exclusive_forward_on",
    "resolve_device",
    "resolve_dtype",
]

logger = logging.getLogger("mmencode.runtime")

# Longest a SIGTERM waits for work in flight; orchestrators' grace periods must be longer
# (docker-compose.yml's stop_grace_period, the Deployment's terminationGracePeriodSeconds).
DRAIN_GRACE_S = 30.0

# Bump when the embedded default checkpoint's recipe changes, so stale builds are not reused.
_DEFAULT_MODEL_REVISION = "qwen2_vl-tiny-v1"


class Phase(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    FAILED = "failed"


def default_model_dir(settings: Settings) -> Path:
    return settings.cache_dir / "models" / _DEFAULT_MODEL_REVISION


def resolve_device(name: str | None) -> torch.device:
    if name:
        return torch.device(name)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def batch_token_budget(configured: int | None, device: torch.device) -> int:
    """Rows per forward. On CPU (bench/README.md) throughput per image drops past a few images of a
    mid-size tower, as activations leave the caches; on a GPU batching is what fills the device."""
    if configured is not None:
        return configured
    return 16384 if device.type == "cuda" else 512


def batch_wait_seconds(configured_ms: float | None, *, forward_beside_preprocessing: bool) -> float:
    """How long a batch waits for requests on their way to it (app/engine/worker.py).

    20 ms when the forward runs on the CPU beside preprocessing (a small tower on one thread): each
    forward's fixed cost (Python, dispatch: about a millisecond) is then CPU taken from decoding, so
    fewer, fuller forwards serve more images. On the tiny CLIP at 16 concurrent requests, 20 ms took
    batches from 2 to 6 images and throughput up 11-13 % (bench/README.md, "Batches on a CPU"). 2 ms
    otherwise: a forward that takes the CPU in turns with preprocessing gains nothing from waiting for
    it, and a mid-size tower runs slower per image in bigger batches there; on a GPU the forward's time
    is the device's, and the next batch forms while this one runs.
    """
    if configured_ms is not None:
        return configured_ms / 1000
    return 0.020 if forward_beside_preprocessing else 0.002


def exclusive_forward_on(configured: bool | None, device: torch.device) -> bool:
    """Whether forwards take the CPU for themselves (app/engine/compute_gate.py): by default, on the CPU only."""
    if configured is not None:
        return configured
    return device.type == "cpu"


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[name]


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """What the loaded model is, for the APIs: its names, shapes and how it computes."""

    model_name: str
    family: str
    device: torch.device
    dtype: torch.dtype  # the encoder's compute dtype
    hidden_size: int  # a row's width
    pooled_width: int  # the leading columns a pooled vector averages (EncoderAdapter.pooled_width)
    image_processor_backend: str  # pil or torchvision
    started_at: int


# A check an API runs on the loaded model before the engine says it is ready (the chat front door's
# transport, say); raising CheckpointError fails the start as a checkpoint the service cannot serve.
StartupCheck = Callable[[EngineInfo], None]


class Engine:
    """The encoder behind every API: load, warm up, serve, drain; and what exists only once the model is
    loaded (the worker, the scheduler, the shared cache tier keyed by the model's fingerprint)."""

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        metrics: Metrics,
        *,
        frame_choices: Mapping[SamplingRule, FrameChoice] | None = None,
    ) -> Engine:
        """The engine of ``settings``. ``frame_choices``: what each video sampling rule but the checkpoint's
        own hands the adapters (the peers' frame choices; the composition root knows them)."""
        fetcher = MediaFetcher(
            timeout=settings.url_fetch_timeout,
            max_redirects=settings.url_max_redirects,
            max_bytes=settings.max_image_bytes,
            allow_private=settings.allow_private_urls,
            allowed_hosts=settings.allowed_url_hosts,
        )
        engine = cls(settings, metrics=metrics, fetcher=fetcher, local_cache=LRUEmbeddingCache(settings.cache_bytes))
        engine.frame_choices.update(frame_choices or {})
        return engine

    def __init__(
        self, settings: Settings, *, metrics: Metrics, fetcher: MediaFetcher, local_cache: LRUEmbeddingCache
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.fetcher = fetcher
        self.local_cache = local_cache
        self.startup_checks: list[StartupCheck] = []
        # Run when a drain begins (SGLang's registration withdrawn, say), before the work in flight ends.
        self.drain_hooks: list[Callable[[], Awaitable[None]]] = []
        self._hooks_running: set[asyncio.Future[None]] = set()
        self.frame_choices: dict[SamplingRule, FrameChoice] = {}
        self.phase = Phase.STARTING
        self.started_at = int(time.time())
        self.failure: str | None = None
        # Called once if the model fails to load; `mmencode serve` stops the process with it (fail fast).
        self.on_failure: Callable[[], None] | None = None
        # Called once when the model is loaded and warm; `mmencode serve` freezes GC with it (app/cli.py).
        self.on_ready: Callable[[], None] | None = None
        self.model_dir = settings.model or default_model_dir(settings)
        self.model_name = settings.served_model_name or self.model_dir.name
        self.adapter: EncoderAdapter | None = None
        self.worker: EncoderWorker | None = None
        self.cache: TieredCache | None = None
        self._scheduler: Scheduler | None = None
        # Closed (exclusive forwards) once the model is on the CPU; see exclusive_forward_on.
        self.compute_gate = ComputeGate(enabled=False)
        # Its threads run torch ops serially: only the encoder's thread parallelises (app/engine/threads.py).
        self._pool = GatedThreadPool(
            self.compute_gate,
            max_workers=settings.preprocess_workers,
            thread_name_prefix="mmencode-pre",
            initializer=serial_torch_ops,
        )
        # Blocking work off the event loop (loading, large answers, the shared cache, vLLM's files): this
        # engine's own pool, not the loop's default executor, which belongs to whoever runs the loop.
        self.io_executor = SerialTorchThreadPool(thread_name_prefix="mmencode-io")
        # Every media source becomes bytes here, for the scheduler and for SGLang's bridge alike.
        self.media = MediaLoader(
            fetcher,
            max_bytes={
                "image": settings.max_image_bytes,
                "video": settings.max_video_bytes,
                "audio": settings.max_audio_bytes,
            },
            max_frames=settings.max_video_frames,
            pool=self._pool,
        )
        self.metrics.ready.set_function(lambda: 1.0 if self.ready else 0.0)
        self.metrics.watch(
            queue_depth=lambda: float(self.worker.queue_depth if self.worker is not None else 0),
            queue_bytes=lambda: float(self.worker.queue_bytes if self.worker is not None else 0),
            cache_bytes=lambda: float(self.local_cache.nbytes),
        )

    # ----- lifecycle -----
    async def start(self) -> None:
        """Load, warm up and start the worker; on failure ``on_failure`` is called and /ready stays 503."""
        # uvicorn says "startup complete" once HTTP is up; the model is only loading now.
        logger.info("loading the model from %s; /health answers now, /ready once it is loaded", self.model_dir)
        try:
            adapter = await in_executor(self.io_executor, self._load)
            for check in self.startup_checks:
                check(self._info_of(adapter))
            self.compute_gate.enabled = exclusive_forward_on(self.settings.exclusive_forward, adapter.device)
            worker = EncoderWorker(
                adapter,
                max_batch_tokens=batch_token_budget(self.settings.max_batch_tokens, adapter.device),
                max_batch_items=self.settings.max_batch_items,
                # Until the warm-up has measured the forward's threads; set again below.
                batch_wait_s=batch_wait_seconds(self.settings.batch_wait_ms, forward_beside_preprocessing=False),
                max_queue=self.settings.max_queue,
                max_queue_bytes=self.settings.max_queue_bytes,
                metrics=self.metrics,
                gate=self.compute_gate,
            )
            await in_executor(self.io_executor, worker.warmup, self.settings.cpu_threads)
            # One thread for a small model's forward leaves the other cores to preprocessing: no turns.
            if worker.forward_threads == 1 and self.settings.exclusive_forward is None:
                self.compute_gate.enabled = False
            worker.batch_wait_s = batch_wait_seconds(
                self.settings.batch_wait_ms,
                forward_beside_preprocessing=adapter.device.type == "cpu" and not self.compute_gate.enabled,
            )
            worker.start()
        except Exception as exc:
            if isinstance(exc, CheckpointError):
                # The message says what is wrong with the checkpoint; a traceback would only bury it.
                logger.error("cannot serve %s: %s", self.model_dir, exc)
            else:
                logger.exception("model failed to load from %s", self.model_dir)
            self.failure = f"{type(exc).__name__}: {exc}"
            self.phase = Phase.FAILED
            if self.on_failure is not None:
                self.on_failure()
            return
        limits = Limits(
            max_items=self.settings.max_items_per_request,
            max_image_bytes=self.settings.max_image_bytes,
            max_image_pixels=self.settings.max_image_pixels,
            max_embedding_bytes=self.settings.max_body_bytes,
            request_timeout=self.settings.request_timeout,
            max_video_bytes=self.settings.max_video_bytes,
            video=VideoLimits(
                max_seconds=self.settings.max_video_seconds,
                max_frames=self.settings.max_video_frames,
                max_frame_pixels=self.settings.max_image_pixels,
                max_decoded_bytes=self.settings.max_video_decoded_bytes,
            ),
            max_video_tokens=self.settings.max_video_tokens,
            max_audio_bytes=self.settings.max_audio_bytes,
            audio=AudioLimits(
                max_seconds=min(self.settings.max_audio_seconds, adapter.max_audio_seconds or float("inf"))
            ),
        )
        self.adapter, self.worker = adapter, worker
        tiers: list[CacheTier] = [self.local_cache]
        leases = None
        if self.settings.shared_cache:
            shared = self._shared_cache(adapter)
            tiers.append(shared)
            if self.settings.shared_cache_lease_wait > 0:
                leases = Leases(
                    shared,
                    ttl_s=self.settings.shared_cache_lease_ttl,
                    wait_s=self.settings.shared_cache_lease_wait,
                    metrics=self.metrics,
                )
        self.cache = TieredCache(tiers, self.metrics, leases=leases)
        self._scheduler = Scheduler(
            adapter,
            worker,
            self.cache,
            self.media,
            self._pool,
            limits,
            self.metrics,
            video_sampling=self.settings.video_sampling,
            frame_choices=self.frame_choices,
        )
        self.phase = Phase.READY
        if self.on_ready is not None:
            self.on_ready()
        scheme = "https" if self.settings.ssl_certfile is not None else "http"
        # An audio-only checkpoint has no image processor to speak of.
        processor = f", {adapter.image_processor_backend} image processor" if adapter.takes_images else ""
        logger.info(
            "ready: serving %s (%s, %s%s) on %s at %s://%s:%d (/ready answers 200 from now on)",
            self.model_name,
            adapter.family,
            str(adapter.dtype).removeprefix("torch."),
            processor,
            adapter.device,
            scheme,
            self.settings.host,
            self.settings.port,
        )

    def _load(self) -> EncoderAdapter:
        if self.settings.model is None and not (self.model_dir / "config.json").is_file():
            # The checkpoint builder is imported only here: a served --model never loads it.
            from mmencode.models.tiny import build_tiny

            logger.info("building the embedded tiny model into %s", self.model_dir)
            build_tiny(self.model_dir, "qwen2_vl", overwrite=True)
        device = resolve_device(self.settings.device)
        return load_encoder(
            self.model_dir,
            device=device,
            dtype=resolve_dtype(self.settings.dtype, device),
            image_processor_backend=self.settings.image_processor_backend,
        )

    def _shared_cache(self, adapter: EncoderAdapter) -> SharedCache:
        settings = self.settings
        store_dtype = adapter.dtype if settings.shared_cache_dtype == "auto" else _DTYPES[settings.shared_cache_dtype]
        assert settings.shared_cache is not None
        shared = SharedCache(
            settings.shared_cache,
            fingerprint=adapter.fingerprint,
            store_dtype=store_dtype,
            ttl_s=settings.shared_cache_ttl,
            max_value_bytes=settings.shared_cache_max_value_bytes,
            max_pending_bytes=settings.shared_cache_pending_bytes,
            timeout_s=settings.shared_cache_timeout,
            metrics=self.metrics,
            executor=self.io_executor,
        )
        logger.info("shared cache: %s, values stored as %s", shared.location, str(store_dtype).removeprefix("torch."))
        return shared

    def begin_drain(self) -> None:
        """Stop taking new work: readiness turns 503 while what was accepted finishes, and the drain hooks
        (withdrawing from peers that would send more) run in the background. Safe from a signal handler."""
        if self.phase is Phase.DRAINING:
            return
        if self.phase is not Phase.FAILED:
            self.phase = Phase.DRAINING
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a test's engine): nothing was announced
        for hook in self.drain_hooks:
            loop.call_soon(self._run_hook, hook)

    def _run_hook(self, hook: Callable[[], Awaitable[None]]) -> None:
        task = asyncio.ensure_future(hook())
        self._hooks_running.add(task)
        task.add_done_callback(self._hooks_running.discard)

    async def stop(self, grace_s: float = DRAIN_GRACE_S) -> None:
        self.begin_drain()
        if self._hooks_running:
            await asyncio.gather(*self._hooks_running, return_exceptions=True)
        if self.worker is not None:
            await self.worker.drain(grace_s)
        if self.cache is not None:
            await self.cache.aclose()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.io_executor.shutdown(wait=False, cancel_futures=True)

    # ----- what the APIs and probes ask -----
    @property
    def ready(self) -> bool:
        return self.phase is Phase.READY and self.worker is not None and self.worker.alive

    @property
    def info(self) -> EngineInfo:
        """The loaded model; raises ``NotReady`` (503) until it is loaded and warm."""
        self._require_ready()
        assert self.adapter is not None
        return self._info_of(self.adapter)

    async def encode(
        self, items: Sequence[Item], mode: PrecomputedMode = "strict", *, scope: str | None = None
    ) -> list[ItemResult]:
        """Rows and metadata per item, in request order (the scheduler's rules, app/engine/scheduler.py);
        raises ``NotReady`` (503) until the model is loaded and warm. ``scope``: the request's cache scope
        (its tenant's, ``--cache-scope tenant``; None: the cache every request shares)."""
        return await self._require_ready().encode(items, mode, scope)

    @property
    def image_processor_backend(self) -> str | None:
        """``pil`` or ``torchvision`` once the model is loaded; ``None`` before."""
        return self.adapter.image_processor_backend if self.adapter is not None else None

    def _require_ready(self) -> Scheduler:
        if not self.ready or self._scheduler is None:
            raise NotReady(self.not_ready_reason(), headers={"Retry-After": "5"})
        return self._scheduler

    def _info_of(self, adapter: EncoderAdapter) -> EngineInfo:
        return EngineInfo(
            model_name=self.model_name,
            family=adapter.family,
            device=adapter.device,
            dtype=adapter.dtype,
            hidden_size=adapter.hidden_size,
            pooled_width=adapter.pooled_width,
            image_processor_backend=adapter.image_processor_backend,
            started_at=self.started_at,
        )

    def not_ready_reason(self) -> str:
        if self.phase is Phase.FAILED:
            return f"the model failed to load: {self.failure}"
        if self.phase is Phase.DRAINING:
            return "the service is shutting down"
        if self.phase is Phase.READY:
            return "the encoder worker has stopped"
        return "the model is still loading"

    def check_model(self, requested: str | None) -> None:
        if requested is not None and requested != self.model_name:
            raise ModelNotFound(
                f"model {requested!r} is not served here; this service serves {self.model_name!r}",
                param="model",
                details={"requested": requested, "available": [self.model_name]},
            )
