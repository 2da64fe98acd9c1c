"""Every setting of the service: one pydantic-settings class, read from ``MMENCODE_*`` and the CLI."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ByteSize, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from mmencode.app.suggest import did_you_mean

__all__ = ["SECURITY_SETTINGS", "Settings", "consumer_address", "misspelt_security_settings", "unknown_environment"]

MiB = 1024 * 1024


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mmencode"


class Settings(BaseSettings):
    """Configuration of one ``mmencode serve`` process. Built once and passed explicitly."""

    model_config = SettingsConfigDict(env_prefix="MMENCODE_", extra="forbid", frozen=True)

    # --- model ---
    model: Path | None = Field(
        default=None,
        description="Local save_pretrained directory of the encoder; unset: the embedded tiny Qwen2-VL.",
    )
    served_model_name: str | None = Field(default=None, description="Model id in the API; default: the dir name.")
    device: str | None = Field(default=None, description="Torch device, e.g. cuda, cuda:1, cpu; default: cuda if any.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="Weights and compute dtype; auto: bfloat16 on CUDA, float32 on CPU."
    )
    cache_dir: Path = Field(default_factory=_default_cache_dir, description="Where the embedded model is built.")
    image_processor_backend: Literal["auto", "pil", "torchvision"] = Field(
        default="auto",
        description="transformers' image processor implementation; auto: torchvision when it imports, as "
        "transformers and vLLM choose, so the rows are the ones the LLM server computes. Match the server's: "
        "vLLM with --mm-processor-kwargs '{\"use_fast\": false}' preprocesses with pil.",
    )

    # --- HTTP ---
    host: str = Field(
        default="127.0.0.1", description="Address to listen on; 0.0.0.0 (or ::) to accept connections from other hosts."
    )
    port: int = Field(default=8000, ge=0, le=65535, description="TCP port to listen on.")
    log_level: Literal["debug", "info", "warning", "error"] = Field(default="info", description="Logging threshold.")
    keep_alive_timeout: int = Field(
        default=75,
        ge=1,
        description="Seconds an idle keep-alive connection stays open. Longer than clients' pool expiry "
        "(httpx: 5 s), so the server never closes a connection just as a client reuses it.",
    )

    # --- batching and admission ---
    max_batch_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Rows per encoder forward (a larger single request still runs alone). "
        "Unset: 16384 on CUDA; 512 on CPU, where bigger batches fall out of cache and run slower per image.",
    )
    max_batch_items: int = Field(default=64, ge=1, description="Images per encoder forward.")
    batch_wait_ms: float | None = Field(
        default=None,
        ge=0,
        le=1000,
        description="Longest wait to fill a batch with requests already being decoded and preprocessed; a "
        "batch with none on their way starts at once. Unset: 20 when a small model's forward runs on the CPU "
        "beside preprocessing (its fixed cost comes out of preprocessing's cores), else 2.",
    )
    max_queue: int = Field(
        default=256, ge=1, description="Requests waiting for the encoder (being preprocessed or queued); past it: 503."
    )
    max_queue_bytes: ByteSize = Field(
        default=ByteSize(2048 * MiB),
        ge=1,
        description="Bytes of preprocessed inputs (pixels, a video's frames) waiting for the encoder or in its "
        "forward; a request that would pass it: 503 (one request alone always runs).",
    )
    request_timeout: float = Field(default=60.0, gt=0, description="Seconds before a request answers 504.")
    preprocess_workers: int = Field(
        default_factory=lambda: max(1, os.cpu_count() or 1), ge=1, description="Threads decoding images; default: CPUs."
    )
    cpu_threads: int | None = Field(
        default=None,
        ge=1,
        description="Threads each forward uses on a CPU device. Unset: measured at start, all cores, or one "
        "when the model is too small to gain from more (the other cores then decode and preprocess).",
    )
    exclusive_forward: bool | None = Field(
        default=None,
        description="Give each encoder forward the CPU to itself: decoding and preprocessing wait while it runs. "
        "Unset: on when the model runs on the CPU (both would oversubscribe the same cores), off on CUDA.",
    )

    # --- cache ---
    # Sizes: bytes, or with a unit (512MiB, 1GiB, 500MB); pydantic's ByteSize parses them.
    cache_bytes: ByteSize = Field(
        default=ByteSize(512 * MiB), ge=0, description="Embedding cache size, e.g. 512MiB or 2GiB; 0 disables it."
    )
    response_memo_bytes: ByteSize = Field(
        default=ByteSize(256 * MiB),
        ge=0,
        description="Answers' encoded rows kept for repeats (a hit then copies bytes instead of encoding a "
        "real-size item again, 0.1-0.5 s); 0 disables it.",
    )
    shared_cache: str | None = Field(
        default=None,
        description="Redis/Valkey URL of a cache shared by replicas (redis://HOST:PORT/DB, rediss:// for TLS, "
        "unix://PATH); unset: the local cache only.",
    )
    shared_cache_ttl: int = Field(
        default=86400, ge=0, description="Seconds a shared-cache entry lives (refreshed when rewritten); 0: no expiry."
    )
    shared_cache_timeout: float = Field(
        default=0.25,
        gt=0,
        le=30,
        description="Seconds one shared-cache call may take before it counts as a miss; after a failure the tier "
        "rests for a second, then is tried again.",
    )
    shared_cache_max_value_bytes: ByteSize = Field(
        default=ByteSize(64 * MiB), ge=1024, description="Larger items are not written to the shared cache (64MiB)."
    )
    shared_cache_pending_bytes: ByteSize = Field(
        default=ByteSize(256 * MiB),
        ge=0,
        description="Bytes of values being written to the shared cache in the background; a write past it is "
        "skipped (counted as backlog), so a slow store never piles up rows in this process.",
    )
    shared_cache_lease_ttl: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="Seconds a replica's lease on an item it is encoding lives unless renewed (every third of it, "
        "while the encode runs): how long a replica that died holding one keeps the others waiting.",
    )
    shared_cache_lease_wait: float = Field(
        default=30.0,
        ge=0,
        description="Longest a replica waits for another replica's encode of the same item (--shared-cache) before "
        "encoding it itself; 0: no leases, every replica encodes what it misses.",
    )
    shared_cache_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto",
        description="Storage dtype of shared-cache values; auto: the model's compute dtype, which loses nothing. "
        "A narrower one halves the bytes but rounds remote hits.",
    )

    # --- limits ---
    max_items_per_request: int = Field(default=64, ge=1, description="Images per request; past it: 413.")
    max_body_bytes: ByteSize = Field(
        default=ByteSize(64 * MiB), ge=1024, description="Request body size; past it: 413."
    )
    max_image_bytes: ByteSize = Field(
        default=ByteSize(20 * MiB), ge=1, description="One image file's size; past it: 413."
    )
    max_image_pixels: int = Field(
        default=40_000_000, ge=1, description="Width*height of an image or of a video's frame, checked before decoding."
    )
    max_video_bytes: ByteSize = Field(
        default=ByteSize(48 * MiB), ge=1, description="One video file's size; past it: 413."
    )
    max_video_seconds: float = Field(
        default=600.0,
        gt=0,
        description="Length of one video (its header's, then its frames' count over its frame rate); past it: 413.",
    )
    max_video_frames: int = Field(
        default=768,
        ge=1,
        description="Frames of one video kept for the encoder at its sampling, counted before decoding; past it: 413.",
    )
    max_video_decoded_bytes: ByteSize = Field(
        default=ByteSize(2048 * MiB), ge=1, description="RGB bytes of one video's kept frames; past it: 413."
    )
    max_video_tokens: int = Field(
        default=32768, ge=1, description="Rows one video may yield at the checkpoint's sampling; past it: 413."
    )
    video_sampling: Literal["checkpoint", "sglang"] = Field(
        default="checkpoint",
        description="Whose frame sampling a video item follows unless it says (`sampling`): `checkpoint` (its "
        "transformers video processor's) or `sglang` (SGLang 0.5.23's own, when it decodes a clip itself; for "
        "a server behind SGLang's encoder protocol).",
    )
    max_audio_bytes: ByteSize = Field(
        default=ByteSize(25 * MiB), ge=1, description="One audio file's size; past it: 413."
    )
    max_audio_seconds: float = Field(
        default=30.0,
        gt=0,
        description="Length of one audio clip (its header's, then its decoded samples'); past it: 413. Never more "
        "than the model's feature-extractor window (Whisper's: 30 s), which the model cannot see past.",
    )

    # --- URL fetching ---
    url_fetch_timeout: float = Field(default=10.0, gt=0, description="Seconds for a whole image URL fetch.")
    url_max_redirects: int = Field(default=3, ge=0, description="Redirects followed per image URL.")
    allow_private_urls: bool = Field(default=False, description="Allow URLs that resolve to private addresses.")
    allowed_url_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Hosts exempt from the private-address check, comma-separated (a,b).",
    )

    # --- LLM servers (app/integrations) ---
    ec_shared_storage: Path | None = Field(
        default=None,
        description="Also write every encoded or cached item to DIR/<hash>/encoder_cache.safetensors, "
        "where vLLM's ECExampleConnector (ec_consumer) reads it; the directory vLLM's "
        "ec_connector_extra_config.shared_storage_path names.",
    )
    ec_storage_bytes: ByteSize = Field(
        default=ByteSize(10 * 1024 * MiB),
        ge=0,
        description="Budget of --ec-shared-storage, shared by every replica writing there: the least recently "
        "written or read files are removed to make room, never one younger than --ec-min-age (a write is refused "
        "instead: ec_cache_path null); 0: unbounded.",
    )
    ec_min_age: float = Field(
        default=120.0,
        ge=0,
        description="Seconds an encoder-cache file is kept after the last answer that named it, whatever the "
        "budget: longer than a consumer takes to load a file it was sent the hash of.",
    )
    ec_dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        default="auto",
        description="Dtype of the encoder-cache files; auto: the encoder's compute dtype (--dtype: float32 on "
        "CPU, bfloat16 on CUDA). Set the consumer's model dtype: vLLM reads any dtype and converts the rows "
        "to its own without a word, so a narrower file silently gives it rounded rows.",
    )
    ec_push_consumers: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="vLLM ECMooncakeConnector consumers /v1/encode may push rows to (its ec_transfer_params."
        "consumer_zmq), host:port each, comma-separated; * allows any (only where every client is trusted: "
        "mmencode then connects and writes wherever a request says). Needs the mooncake extra.",
    )
    mooncake_protocol: Literal["tcp", "rdma"] = Field(
        default="tcp",
        description="Mooncake's transport for pushes: tcp, or rdma (InfiniBand/RoCE; the consumers' "
        "mooncake_protocol must be the same).",
    )
    mooncake_hostname: str | None = Field(
        default=None,
        description="The address this host's Mooncake transfer engine announces; unset: the local address of "
        "the route to the first consumer (127.0.0.1 on one machine).",
    )
    mooncake_device: str = Field(
        default="",
        description="RDMA devices for Mooncake (mlx5_0,mlx5_1); empty: Mooncake picks them. Unused over tcp.",
    )
    mooncake_push_timeout: float = Field(
        default=30.0,
        gt=0,
        description="Seconds one push may take, from the first reservation to the last completion; past it the "
        "push is cancelled and the request answers 503 ec_push_failed.",
    )
    mooncake_control_timeout: float = Field(
        default=5.0,
        gt=0,
        description="Seconds a consumer may take to answer one control request (reserve, complete, cancel).",
    )
    sglang_dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        default="auto",
        description="Dtype of the embeddings pushed to SGLang; auto: the encoder's compute dtype (float32 on CPU, "
        "bfloat16 on CUDA), what SGLang's own encoder pushes. SGLang casts the rows to its model's dtype.",
    )
    sglang_register_url: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="SGLang language servers to register with as an encoder once the model is ready, by their "
        "encoder bootstrap URL (http://HOST:8997, SGLang's --encoder-bootstrap-port), comma-separated; "
        "unregistered when this server drains.",
    )
    sglang_advertise_url: str | None = Field(
        default=None,
        description="The URL SGLang language servers reach this server at, as --sglang-register-url announces it; "
        "unset: http(s)://HOST:PORT, which needs a --host they can reach (not 0.0.0.0 or ::).",
    )
    sglang_push_timeout: float = Field(
        default=30.0,
        gt=0,
        description="Seconds a ZMQ push to an SGLang language server may wait for it to connect and take the message.",
    )

    # --- the chat front door (app/frontdoor) ---
    upstream: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="OpenAI-compatible vLLM servers (started with --enable-mm-embeds) behind POST "
        "/v1/chat/completions, which encodes the images here and forwards their rows; repeat the flag or "
        "comma-separate (http://a:8000,http://b:8000). Unset: no front door.",
    )
    upstream_transport: Literal["embeds", "ec", "mooncake"] = Field(
        default="embeds",
        description="How the rows reach the upstreams: embeds, inside the request as image_embeds parts; ec, "
        "as vLLM encoder-cache connector files (needs --ec-shared-storage, shared with the upstreams' "
        "ECExampleConnector consumer); mooncake, pushed into each upstream's ECMooncakeConnector consumer "
        "(needs --upstream-ec-control and the mooncake extra). With ec and mooncake the request carries "
        "metadata only.",
    )
    upstream_ec_control: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="With --upstream-transport mooncake: each upstream's ECMooncakeConnector control address, "
        "host:port (its ec_transfer_config's ec_ip and ec_port), one per --upstream, in the same order.",
    )
    upstream_dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        default="auto",
        description="Dtype of the rows in image_embeds parts; auto: the encoder's compute dtype. Set the "
        "upstream's model dtype: vLLM converts the rows to its own without a word.",
    )
    upstream_api_key: SecretStr | None = Field(
        default=None, description="Sent to the upstreams as `Authorization: Bearer KEY` (their --api-key)."
    )
    upstream_timeout: float = Field(
        default=600.0,
        gt=0,
        description="Seconds an upstream may take to start its answer, and between two of its bytes; past it: 504.",
    )
    upstream_health_interval: float = Field(
        default=5.0,
        gt=0,
        description="Seconds between health checks of each upstream; one that fails leaves the rotation until "
        "it answers again.",
    )

    # --- security ---
    api_key: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list,
        description="Keys clients must send as `Authorization: Bearer KEY` on /v1/*, comma-separated; "
        "`TENANT:KEY` puts the key in a tenant (a key without one is a tenant of its own; see --cache-scope); "
        "unset: no authentication. Probes and /metrics stay open.",
    )
    api_key_file: Path | None = Field(
        default=None,
        description="A file of API keys, one per line (# comments), `KEY` or `TENANT:KEY`, added to --api-key.",
    )
    cache_scope: Literal["tenant", "global"] | None = Field(
        default=None,
        description="Who shares cached rows: `tenant`, each tenant its own (a hash answered to one tenant is "
        "unknown_hash to another, and its image is encoded again for it); `global`, every client. Unset: "
        "tenant when API keys are set, else global. Connector files (--ec-shared-storage) stay shared.",
    )
    ssl_certfile: Path | None = Field(default=None, description="PEM certificate (chain): serve HTTPS.")
    ssl_keyfile: Path | None = Field(default=None, description="PEM private key of --ssl-certfile.")
    ignore_unknown_env: bool = Field(
        default=False,
        description="Start even if an MMENCODE_* variable that names no setting looks like a misspelt security "
        "setting (MMENCODE_API_KEYS for MMENCODE_API_KEY, ...); without it such a typo stops the start, since "
        "it would leave the service without the keys or TLS it names.",
    )

    @field_validator(
        "allowed_url_hosts",
        "api_key",
        "upstream",
        "sglang_register_url",
        "upstream_ec_control",
        "ec_push_consumers",
        mode="before",
    )
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        """``a,b`` from a flag or the environment; a JSON list is accepted too."""
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [part.strip() for part in text.split(",") if part.strip()]
        return value

    def advertised_url(self) -> str:
        """This server's URL as an SGLang language server reaches it (--sglang-advertise-url, or HOST:PORT)."""
        if self.sglang_advertise_url is not None:
            return self.sglang_advertise_url.rstrip("/")
        scheme = "https" if self.ssl_certfile is not None else "http"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}"

    def api_keys(self) -> list[str]:
        """Every accepted key: --api-key's, then --api-key-file's (without their ``TENANT:``)."""
        return list(self.api_key_tenants())

    def api_key_tenants(self) -> dict[str, str | None]:
        """Every accepted key and its tenant: the name before the first ``:`` of its entry, or None (the key
        is a tenant of its own). ``ValueError`` (never naming the key) for an entry with an empty tenant or
        key, or a key given to two tenants."""
        entries = [key.get_secret_value() for key in self.api_key]
        if self.api_key_file is not None:
            for line in self.api_key_file.read_text().splitlines():
                if line.strip() and not line.lstrip().startswith("#"):
                    entries.append(line.strip())
        tenants: dict[str, str | None] = {}
        for number, entry in enumerate(entries, start=1):
            tenant, separator, key = entry.partition(":")
            if not separator:
                tenant, key = "", entry
            elif not tenant.strip() or not key.strip():
                raise ValueError(f"API key entry {number} is `TENANT:KEY` with an empty tenant or key")
            tenant, key = tenant.strip(), key.strip()
            owner = tenant or None
            if key in tenants and tenants[key] != owner:
                raise ValueError(f"API key entry {number} repeats a key of another tenant; give each key one tenant")
            tenants[key] = owner
        return tenants

    def scoped_by_tenant(self) -> bool:
        """Whether cached rows are kept per tenant (--cache-scope, by default tenant when keys are set)."""
        if self.cache_scope is None:
            return bool(self.api_keys())
        return self.cache_scope == "tenant"

    @field_validator("upstream")
    @classmethod
    def _upstream_urls(cls, value: list[str]) -> list[str]:
        """``http(s)://host[:port]``, without the trailing slash; each upstream once."""
        urls: list[str] = []
        for url in value:
            scheme, _, rest = url.partition("://")
            if scheme not in {"http", "https"} or not rest.strip("/"):
                raise ValueError(f"upstream {url!r} is not an http:// or https:// URL")
            url = url.rstrip("/").removesuffix("/v1")
            if url not in urls:
                urls.append(url)
        return urls

    @field_validator("upstream_ec_control")
    @classmethod
    def _control_addresses(cls, value: list[str]) -> list[str]:
        return [consumer_address(address) for address in value]

    @field_validator("ec_push_consumers")
    @classmethod
    def _push_consumers(cls, value: list[str]) -> list[str]:
        return [address if address == "*" else consumer_address(address) for address in value]

    @property
    def mooncake(self) -> bool:
        """Whether this server pushes rows with Mooncake (the front door's transport, or /v1/encode's)."""
        return self.upstream_transport == "mooncake" or bool(self.ec_push_consumers)

    @field_validator("shared_cache")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        if value and value.partition("://")[0] not in {"redis", "rediss", "unix"}:
            raise ValueError("shared_cache must be a redis://, rediss:// or unix:// URL")
        return value or None

    @model_validator(mode="after")
    def _sane(self) -> Settings:
        if self.max_image_bytes > self.max_body_bytes:
            raise ValueError("max_image_bytes cannot exceed max_body_bytes")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("ssl_certfile and ssl_keyfile go together: give both to serve HTTPS, or neither")
        for name in ("ssl_certfile", "ssl_keyfile", "api_key_file"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{name} {path} is not a readable file")
        if self.sglang_register_url and self.sglang_advertise_url is None and self.host in {"0.0.0.0", "::", ""}:
            raise ValueError(
                "sglang_register_url needs the URL the language servers reach this server at: set "
                "sglang_advertise_url (listening on every address says nothing of which one they reach)"
            )
        if self.upstream_transport == "ec" and self.ec_shared_storage is None:
            raise ValueError(
                "upstream_transport ec needs ec_shared_storage: the directory the upstreams' ECExampleConnector reads"
            )
        if self.upstream_transport == "mooncake" and len(self.upstream_ec_control) != len(self.upstream):
            raise ValueError(
                f"upstream_transport mooncake needs one upstream_ec_control address per upstream, in the same "
                f"order: {len(self.upstream)} upstreams, {len(self.upstream_ec_control)} control addresses"
            )
        if self.upstream_ec_control and self.upstream_transport != "mooncake":
            raise ValueError("upstream_ec_control is the mooncake transport's: set upstream_transport mooncake")
        self.api_key_tenants()  # each entry well formed, each key in one tenant
        if self.api_key_file is not None and not self.api_keys():
            raise ValueError(f"api_key_file {self.api_key_file} holds no key")
        if self.cache_scope == "tenant" and not self.api_keys():
            raise ValueError(
                "cache_scope tenant needs API keys (--api-key, --api-key-file): tenants are the keys' groups"
            )
        return self


def consumer_address(address: str) -> str:
    """A consumer's control address, ``host:port`` or ``tcp://host:port``, as ZMQ's ``tcp://host:port``."""
    text = address.strip()
    rest = text.removeprefix("tcp://")
    host, _, port = rest.rpartition(":")
    if not host or "/" in rest or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{address!r} is not a consumer control address (host:port or tcp://host:port)")
    return f"tcp://{host}:{int(port)}"


# What Kubernetes injects for a Service named "mmencode" (service links): not settings, not typos.
_SERVICE_LINK = re.compile(r"MMENCODE_(SERVICE_HOST|SERVICE_PORT(_\w+)?|PORT_\d+_(TCP|UDP|SCTP)(_\w+)?)")


def unknown_environment(environ: Mapping[str, str], prefix: str = "MMENCODE_") -> list[str]:
    """A warning for each ``MMENCODE_*`` variable that names no setting (a typo would be ignored silently)."""
    return [
        f"{variable} is not an mmencode setting and is ignored" + (f"; did you mean {meant}?" if meant else "")
        for variable, meant in _unknown_variables(environ, prefix)
    ]


# Settings whose typo would leave the service more open than the operator meant (no keys, no TLS).
SECURITY_SETTINGS = ("api_key", "api_key_file", "ssl_certfile", "ssl_keyfile")


def misspelt_security_settings(environ: Mapping[str, str], prefix: str = "MMENCODE_") -> list[str]:
    """An error for each unknown ``MMENCODE_*`` variable that is closest to a security setting.

    Ignored, ``MMENCODE_API_KEYS=secret`` would serve with no authentication: ``mmencode serve``
    refuses to start on these unless ``--ignore-unknown-env`` (``MMENCODE_IGNORE_UNKNOWN_ENV=1``).
    """
    security = {prefix + name.upper() for name in SECURITY_SETTINGS}
    return [
        f"{variable} is not an mmencode setting; did you mean {meant}? Ignored, it would leave the service "
        f"{'without TLS' if 'SSL' in meant else 'without API keys'}"
        for variable, meant in _unknown_variables(environ, prefix)
        if meant in security
    ]


def _unknown_variables(environ: Mapping[str, str], prefix: str) -> list[tuple[str, str | None]]:
    """``(variable, the setting's variable it most likely meant)`` for each ``MMENCODE_*`` that names none."""
    known = {prefix + name.upper() for name in Settings.model_fields}
    unknown = []
    for variable in sorted(name for name in environ if name.upper().startswith(prefix)):
        if variable.upper() in known or _SERVICE_LINK.fullmatch(variable.upper()):
            continue
        unknown.append((variable, did_you_mean(variable.upper(), known)))
    return unknown
