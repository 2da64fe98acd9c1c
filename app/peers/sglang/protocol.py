"""SGLang's encoder protocol (sglang 0.5.23) on the wire: what mmencode pushes where SGLang waits.

The language server ``POST``s ``/encode`` with the images of one part of a request; the encoder pushes
the result over ZMQ (``sglang/srt/disaggregation/encoder/server.py: MMEncoder._send``):

- frame 0: a pickled ``sglang.srt.disaggregation.encoder.receiver.EmbeddingData`` without its
  embedding (``copy_without_embedding``), read with SGLang's ``safe_pickle_loads`` allow-list;
- frame 1: the rows' raw bytes, read with ``torch.frombuffer(buf, dtype=obj.dtype).reshape(obj.shape)``.

A failure is one frame: the ``EmbeddingData`` with ``error_msg``/``error_code`` set.

mmencode never imports sglang (a multi-GB install): frame 0 is written from stand-in classes whose
pickled class paths are SGLang's, by a pickler that names them without importing them.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import torch

from mmencode.app.engine.errors import ServiceError
from mmencode.app.http.locators import ErrorLocator
from mmencode.schemas.sglang import SGLangEncodeRequest

__all__ = [
    "EMBEDDING_DATA_CLASS",
    "GRID_FIELDS",
    "MODALITY_CLASS",
    "SGLANG_LOCATOR",
    "VIDEO_META",
    "embedding_frames",
    "error_frames",
]

# SGLang's names: the request's `mm_items[i]`, whose image or video is its `url` and whose hash its `content_hash`.
SGLANG_LOCATOR = ErrorLocator(
    "mm_items", "mm_items[{index}]", {"image": "url", "video": "url", "audio": "url", "hash": "content_hash"}
)

EMBEDDING_DATA_CLASS = ("sglang.srt.disaggregation.encoder.receiver", "EmbeddingData")
MODALITY_CLASS = ("sglang.srt.multimodal.modality", "Modality")
# sglang.srt.multimodal.modality.Modality's values, and the item metadata SGLang's receiver takes as the
# part's grid (``grid_dim``) for each: the grids of images and clips; for audio, each clip's mel frame
# count (SGLang's ``audio_feature_lens_raw``, a LongTensor its receiver flattens into ``audio_feature_lens``).
_MODALITIES: dict[str, tuple[int, str]] = {
    "IMAGE": (1, "image_grid_thw"),
    "VIDEO": (2, "video_grid_thw"),
    "AUDIO": (3, "audio_feature_length"),
}
# Per-item video metadata SGLang's encoder sends beside a VIDEO part (receiver.py's
# _GENERAL_VIDEO_META_ATTRS), one entry per clip; its receiver chains each part's list into the model's
# inputs. mmencode's metadata name -> SGLang's attribute: Qwen2.5-VL's seconds per temporal patch, and
# Qwen3-VL's and Qwen3.5's per-patch timestamps (vLLM's `timestamps`).
VIDEO_META = {"second_per_grid_ts": "second_per_grid_ts", "timestamps": "video_timestamps"}


# ----- frame 0: SGLang's EmbeddingData, pickled without SGLang -----
class _EmbeddingData:
    """Carries the attributes of SGLang's ``EmbeddingData``; pickled under SGLang's class path."""

    def __init__(self, **attributes: Any) -> None:
        self.__dict__.update(attributes)


class _Modality:
    """Pickles as ``Modality(value)``, which the unpickler turns into SGLang's enum member."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return _Modality, (self.value,)


_PEER_CLASSES: dict[type, tuple[str, str]] = {_EmbeddingData: EMBEDDING_DATA_CLASS, _Modality: MODALITY_CLASS}


class _PeerPickler(pickle._Pickler):
    """The standard pickler, except that the stand-ins are written under SGLang's class paths.

    The standard ``save_global`` imports a class's module to check the name; SGLang's module is not
    installed here, so for the stand-ins the same opcodes are written without the check.
    """

    def save_global(self, obj: Any, name: str | None = None) -> None:
        path = _PEER_CLASSES.get(obj) if isinstance(obj, type) else None
        if path is None:
            super().save_global(obj, name)  # type: ignore[misc]
            return
        module, qualname = path
        self.save(module)  # type: ignore[attr-defined]
        self.save(qualname)  # type: ignore[attr-defined]
        self.write(pickle.STACK_GLOBAL)  # type: ignore[attr-defined]
        self.memoize(obj)  # type: ignore[attr-defined]


def _pickle(obj: object) -> bytes:
    buffer = io.BytesIO()
    _PeerPickler(buffer, protocol=4).dump(obj)
    return buffer.getvalue()


def _embedding_data(
    request: SGLangEncodeRequest,
    *,
    grid_dim: list[list[int]] | torch.Tensor | None = None,
    dtype: torch.dtype | None = None,
    shape: list[int] | None = None,
    error_msg: str | None = None,
    error_code: int | None = None,
    video_meta: dict[str, list[Any]] | None = None,
) -> _EmbeddingData:
    # Exactly the attributes of SGLang's EmbeddingData.copy_without_embedding(), in its order; then the
    # video metadata its encoder adds as keyword attributes.
    return _EmbeddingData(
        req_id=request.req_id,
        num_parts=request.num_parts,
        part_idx=request.part_idx,
        grid_dim=grid_dim,
        modality=_Modality(_MODALITIES[request.modality.upper()][0]),
        embedding=None,
        send_time=None,
        dtype=dtype,
        shape=shape,
        _mr_ptr=None,
        error_msg=error_msg,
        error_code=error_code,
        **(video_meta or {}),
    )


def embedding_frames(
    request: SGLangEncodeRequest,
    rows: torch.Tensor,
    grid_dim: list[list[int]] | torch.Tensor | None,
    video_meta: dict[str, list[Any]] | None = None,
) -> list[bytes | memoryview]:
    """The two frames of a successful part: pickled metadata, then the rows' native bytes."""
    rows = rows.contiguous()
    header = _pickle(
        _embedding_data(request, grid_dim=grid_dim, dtype=rows.dtype, shape=list(rows.shape), video_meta=video_meta)
    )
    return [header, rows.view(torch.uint8).numpy().tobytes()]


def error_frames(request: SGLangEncodeRequest, error: ServiceError) -> list[bytes | memoryview]:
    """The single frame of a failed part: ``error_code`` is the HTTP status mmencode answers with."""
    message = f"{error.code}: {SGLANG_LOCATOR.message(error)}"
    return [_pickle(_embedding_data(request, error_msg=message, error_code=error.status))]


def GRID_FIELDS(modality: str) -> str:
    """The item metadata SGLang's receiver takes as a part's grid, for its modality (``IMAGE``...)."""
    return _MODALITIES[modality.upper()][1]
