"""SGLang's encoder-server requests (sglang 0.5.23), as its language server sends them.

``POST /encode`` comes from ``sglang/srt/disaggregation/encoder/receiver.py`` (the language side,
started with ``--language-only --encoder-urls``); ``POST /scheduler_receive_url`` from its scheduler
ranks under the ``zmq_to_scheduler`` backend. Fields mmencode does not use (``encoder_idx``,
``encoder_url``, ``time_stats_json``, ``hashes``...) are allowed and ignored, as SGLang's own encoder
ignores what it does not need.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["SGLANG_VERSION", "SGLangEncodeRequest", "SGLangMediaItem", "SGLangReceiveUrlRequest"]

SGLANG_VERSION = "0.5.23"

Port = Annotated[int, Field(ge=1, le=65535)]


class SGLangMediaItem(BaseModel):
    """A media item with options: SGLang sends a bare URL string when there is nothing else."""

    model_config = ConfigDict(extra="allow")

    url: str = Field(min_length=1, description="A data URL, http(s) URL or bare base64 of the image or video file.")
    content_hash: str | None = Field(
        default=None,
        pattern=r"^sha256:[0-9a-fA-F]{64}$",
        description="`sha256:<hex>` of the image, video or audio file's bytes; verified before encoding.",
    )


class SGLangEncodeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    req_id: str = Field(min_length=1, description="The part id `<rid>_local_part_<i>`; echoed in every message.")
    modality: str = Field(
        description="`IMAGE`, `VIDEO` (models that take videos) or `AUDIO` (audio models: Qwen2-Audio, "
        "Qwen2.5-Omni, Qwen3-Omni)."
    )
    mm_items: list[str | SGLangMediaItem] = Field(min_length=1)
    num_parts: int = Field(ge=1)
    part_idx: int = Field(ge=0)
    prefill_host: str | None = None
    # int: push to that port (zmq_to_tokenizer); list: to each (zmq_to_scheduler with ports);
    # null: to every URL registered through /scheduler_receive_url (zmq_to_scheduler).
    embedding_port: Port | list[Port] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> SGLangEncodeRequest:
        if self.modality.upper() not in ("IMAGE", "VIDEO", "AUDIO"):
            raise ValueError(f"unsupported modality {self.modality!r}: mmencode encodes IMAGE, VIDEO and AUDIO")
        if self.part_idx >= self.num_parts:
            raise ValueError(f"part_idx must be in [0, {self.num_parts})")
        if self.embedding_port is not None and not self.prefill_host:
            raise ValueError("prefill_host is required with embedding_port")
        if isinstance(self.embedding_port, list) and not self.embedding_port:
            raise ValueError("embedding_port must not be an empty list")
        return self

    def items_as_dicts(self) -> list[dict[str, Any]]:
        return [{"url": item} if isinstance(item, str) else item.model_dump() for item in self.mm_items]


class SGLangReceiveUrlRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    req_id: str = Field(min_length=1)
    receive_count: int = Field(ge=1, description="How many scheduler ranks will register for this part.")
    receive_url: str = Field(pattern=r"^\[?[^\s/]+\]?:\d{1,5}$", description="`host:port` of a rank's PULL socket.")
    modality: str | None = None
