"""Every setting of the service: one pydantic-settings class, read from ``MMENCODE_*`` and the CLI."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings"]

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

    # --- HTTP ---
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
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
    batch_wait_ms: float = Field(default=2.0, ge=0, le=1000, description="Longest wait to fill a batch.")
    max_queue: int = Field(default=256, ge=1, description="Requests waiting for the encoder; past it: 503.")
    request_timeout: float = Field(default=60.0, gt=0, description="Seconds before a request answers 504.")
    preprocess_workers: int = Field(
        default_factory=lambda: max(1, os.cpu_count() or 1), ge=1, description="Threads decoding images."
    )

    # --- cache ---
    cache_bytes: int = Field(default=512 * MiB, ge=0, description="Embedding cache size in bytes; 0 disables it.")

    # --- limits ---
    max_items_per_request: int = Field(default=64, ge=1)
    max_body_bytes: int = Field(default=64 * MiB, ge=1024)
    max_image_bytes: int = Field(default=20 * MiB, ge=1)
    max_image_pixels: int = Field(default=40_000_000, ge=1, description="Width*height, checked before decoding.")

    # --- URL fetching ---
    url_fetch_timeout: float = Field(default=10.0, gt=0)
    url_max_redirects: int = Field(default=3, ge=0)
    allow_private_urls: bool = Field(default=False, description="Allow URLs that resolve to private addresses.")
    allowed_url_hosts: list[str] = Field(
        default_factory=list,
        description="Hosts exempt from the private-address check (a JSON list in the environment).",
    )

    # --- LLM servers (app/integrations) ---
    ec_shared_storage: Path | None = Field(
        default=None,
        description="Also write every encoded or cached item to DIR/<hash>/encoder_cache.safetensors, "
        "where vLLM's ECExampleConnector (ec_consumer) reads it; the directory vLLM's "
        "ec_connector_extra_config.shared_storage_path names.",
    )
    ec_dtype: Literal["bfloat16", "float16", "float32"] = Field(
        default="bfloat16", description="Dtype of the encoder-cache files; match the language model's dtype."
    )
    sglang_dtype: Literal["bfloat16", "float16", "float32"] = Field(
        default="bfloat16", description="Dtype of the embeddings pushed to SGLang; match the language model's dtype."
    )
    sglang_push_timeout: float = Field(
        default=30.0,
        gt=0,
        description="Seconds a ZMQ push to an SGLang language server may wait for it to connect and take the message.",
    )

    @model_validator(mode="after")
    def _sane(self) -> Settings:
        if self.max_image_bytes > self.max_body_bytes:
            raise ValueError("max_image_bytes cannot exceed max_body_bytes")
        return self
