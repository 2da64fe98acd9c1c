"""Every Prometheus metric of the service, defined here and only here.

Each app owns a registry (no process-global state), so several apps can live in one process (tests)
and ``/metrics`` shows exactly one service's numbers.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["Metrics"]

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_BATCH_ITEMS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_BATCH_TOKENS_BUCKETS = (16, 64, 256, 1024, 4096, 16384, 65536)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "mmencode_requests", "HTTP requests answered, by route template, method and status.",
            ["route", "method", "status"], registry=r,
        )  # fmt: skip
        self.request_seconds = Histogram(
            "mmencode_request_duration_seconds", "Time from request to response, by route, method and status.",
            ["route", "method", "status"], buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.errors = Counter("mmencode_errors", "Error responses by error code.", ["code"], registry=r)
        self.client_disconnects = Counter(
            "mmencode_client_disconnects",
            "Requests whose client left before the answer; their work was cancelled.",
            registry=r,
        )
        self.items = Counter(
            "mmencode_items", "Items answered, by where their embedding came from.", ["source"], registry=r
        )
        self.inflight_coalesced = Counter(
            "mmencode_inflight_coalesced",
            "Items answered from an encode another request had started for the same content (single flight), "
            "instead of being encoded again.",
            registry=r,
        )
        self.queue_depth = Gauge(
            "mmencode_queue_depth", "Requests waiting for the encoder: being preprocessed or queued.", registry=r
        )
        self.queue_bytes = Gauge(
            "mmencode_queue_bytes",
            "Bytes of preprocessed inputs (pixels, video frames) waiting for the encoder or in its forward "
            "(--max-queue-bytes).",
            registry=r,
        )
        self.batch_items = Histogram(
            "mmencode_batch_items", "Images per encoder forward.", buckets=_BATCH_ITEMS_BUCKETS, registry=r
        )
        self.batch_tokens = Histogram(
            "mmencode_batch_tokens", "Embedding rows per encoder forward.", buckets=_BATCH_TOKENS_BUCKETS, registry=r
        )
        self.encoder_seconds = Histogram(
            "mmencode_encoder_seconds", "Wall time of one encoder forward.", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.cpu_forward_threads = Gauge(
            "mmencode_cpu_forward_threads",
            "Threads each forward uses on a CPU device, as measured at start or set by --cpu-threads; 0 on a GPU.",
            registry=r,
        )
        self.cache_lookups = Counter(
            "mmencode_cache_lookups", "Embedding cache lookups by tier (local, shared) and result (hit, miss).",
            ["tier", "result"], registry=r,
        )  # fmt: skip
        self.cache_bytes = Gauge("mmencode_cache_bytes", "Bytes of embeddings held by the cache.", registry=r)
        self.response_memo_bytes = Gauge(
            "mmencode_response_memo_bytes",
            "Bytes of encoded answers kept for repeats (--response-memo-bytes).",
            registry=r,
        )
        self.shared_cache_errors = Counter(
            "mmencode_shared_cache_errors",
            "Shared-tier operations that failed and were treated as misses or skipped writes, by operation "
            "(get, set, decode: an unreadable value, too_large: over the value cap, backlog: too many writes or "
            "bytes pending).",
            ["op"], registry=r,
        )  # fmt: skip
        self.shared_leases = Counter(
            "mmencode_shared_lease",
            "Leases across replicas on items about to be encoded (--shared-cache), by result: acquired (this "
            "replica encodes), waited (another replica's value answered), took_over (its holder vanished; this "
            "replica encodes), gave_up (waited --shared-cache-lease-wait) and unavailable (the store could not "
            "be asked): those two encode without a lease.",
            ["result"], registry=r,
        )  # fmt: skip
        self.shared_cache_pending_bytes = Gauge(
            "mmencode_shared_cache_pending_bytes",
            "Bytes of values being written to the shared tier in the background (--shared-cache-pending-bytes).",
            registry=r,
        )
        self.shared_cache_bytes_written = Counter(
            "mmencode_shared_cache_written_bytes", "Bytes of values written to the shared tier.", registry=r
        )
        self.requests_in_flight = Gauge(
            "mmencode_requests_in_flight", "API requests being answered now (probes and /metrics excluded).", registry=r
        )
        self.queue_wait_seconds = Histogram(
            "mmencode_queue_wait_seconds", "Time a request waited in the encoder queue before its forward began.",
            buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.ready = Gauge("mmencode_ready", "1 when the model is loaded, warm and the worker alive.", registry=r)
        self.ec_cache_writes = Counter(
            "mmencode_ec_cache_writes",
            "Encoder-cache files for vLLM (--ec-shared-storage), by result: written, present (skipped), refused "
            "(the budget is held by files younger than --ec-min-age) or error.",
            ["result"], registry=r,
        )  # fmt: skip
        self.ec_storage_bytes = Gauge(
            "mmencode_ec_storage_bytes",
            "Bytes of encoder-cache files in --ec-shared-storage (every replica's), as this process last counted "
            "them (--ec-storage-bytes is the budget).",
            registry=r,
        )
        self.ec_storage_files = Gauge(
            "mmencode_ec_storage_files",
            "Encoder-cache files in --ec-shared-storage (every replica's), as this process last counted them.",
            registry=r,
        )
        self.ec_storage_evictions = Counter(
            "mmencode_ec_storage_evictions",
            "Encoder-cache files this process removed to keep --ec-shared-storage within --ec-storage-bytes.",
            registry=r,
        )
        self.sglang_pushes = Counter(
            "mmencode_sglang_pushes",
            "ZMQ messages pushed to SGLang language servers, by kind (embedding or error) and result (ok or failed).",
            ["kind", "result"], registry=r,
        )  # fmt: skip

        # Pushes into vLLM ECMooncakeConnector consumers (the front door's mooncake transport, /v1/encode's
        # ec_transfer_params).
        self.mooncake_pushes = Counter(
            "mmencode_mooncake_pushes",
            "Pushes of rows into a vLLM ECMooncakeConnector consumer, by result: ok (reserved, written, completed), "
            "refused (the consumer said no: a full pool, a lost reservation), failed (no answer, a failed write, "
            "past --mooncake-push-timeout), cancelled (the client left). All but ok cancel what they reserved.",
            ["result"], registry=r,
        )  # fmt: skip
        self.mooncake_push_bytes = Counter(
            "mmencode_mooncake_push_bytes", "Bytes Mooncake wrote into consumers (every shard's copy).", registry=r
        )
        self.mooncake_push_seconds = Histogram(
            "mmencode_mooncake_push_seconds",
            "Time of a push that completed: from the first reservation to the last completion.",
            buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip

        # The chat front door (app/frontdoor): per stage, and per upstream.
        self.chat_stage_seconds = Histogram(
            "mmencode_chat_stage_seconds",
            "Chat front door stages: encode (the request's images, through the cache and encoder), "
            "upstream_first_byte (sending upstream until its first answer byte: prefill, time to first "
            "token when streaming), total (the whole answer, streamed or not).",
            ["stage"], buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.upstream_requests = Counter(
            "mmencode_upstream_requests",
            "Requests sent to each upstream, by result: ok, error (it answered an error status), failed "
            "(no answer: refused, reset, timed out; retried on another upstream while nothing was sent).",
            ["upstream", "result"], registry=r,
        )  # fmt: skip
        self.upstream_in_flight = Gauge(
            "mmencode_upstream_in_flight", "Requests each upstream is answering now.", ["upstream"], registry=r
        )
        self.upstream_healthy = Gauge(
            "mmencode_upstream_healthy", "1 while an upstream is in the rotation (its health check passes).",
            ["upstream"], registry=r,
        )  # fmt: skip
        self.upstream_affinity_hits = Counter(
            "mmencode_upstream_affinity_hits",
            "Chat requests sent to the upstream that recently received one of their images (warm caches).",
            registry=r,
        )

    def watch(
        self, *, queue_depth: Callable[[], float], queue_bytes: Callable[[], float], cache_bytes: Callable[[], float]
    ) -> None:
        """Gauges read at scrape time from their owners."""
        self.queue_depth.set_function(queue_depth)
        self.queue_bytes.set_function(queue_bytes)
        self.cache_bytes.set_function(cache_bytes)

    def render(self) -> bytes:
        return generate_latest(self.registry)
