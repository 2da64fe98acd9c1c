"""OpenAI's embeddings API over images: one L2-normalised mean-pooled vector per image, and the model list.

The vector averages the rows' leading ``pooled_width`` columns: the whole row, except for Qwen3-VL,
whose DeepStack levels ride beside the main embedding and are left out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from mmencode.app.engine.engine import Engine
from mmencode.app.engine.errors import UnsupportedParameter
from mmencode.app.engine.types import AudioItem, ImageItem, Item, VideoItem
from mmencode.app.wire.b64 import encode_ascii
from mmencode.schemas.embeddings import EmbeddingsRequest, ModelCard, ModelList

__all__ = ["EmbeddingsService"]


class EmbeddingsService:
    def __init__(self, engine: Engine, *, upstream_models: Callable[[], list[str]] | None = None) -> None:
        self._engine = engine
        # The chat front door's upstreams' models, listed beside the encoder's own.
        self._upstream_models = upstream_models

    async def embed(self, body: EmbeddingsRequest, *, scope: str | None = None) -> dict[str, Any]:
        """OpenAI's answer, with ``usage`` counting the images' rows; ``scope``: the request's cache scope."""
        self._engine.check_model(body.model)
        width = self._engine.info.pooled_width
        if body.dimensions is not None and body.dimensions != width:
            raise UnsupportedParameter(
                f"dimensions={body.dimensions} is not supported: {self._engine.model_name} returns "
                f"{width}-dimensional vectors",
                param="dimensions",
                details={"requested": body.dimensions, "supported": [width]},
            )
        inputs = [body.input] if isinstance(body.input, str) else body.input
        results = await self._engine.encode([_item(source, body.modality) for source in inputs], scope=scope)
        tokens = sum(result.num_tokens for result in results)
        data = []
        for result in results:
            vector = l2_normalised_mean(result.rows[:, :width])
            encoded = encode_ascii(vector.astype("<f4").tobytes()) if body.encoding_format == "base64" else vector
            data.append({"object": "embedding", "index": result.index, "embedding": encoded})
        return {
            "object": "list",
            "data": data,
            "model": self._engine.model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    def models(self) -> ModelList:
        """The encoder's own id, marked with the routes that take it; behind the front door, the upstreams'
        chat models first, since they are what an OpenAI chat client lists models for."""
        encoder = ModelCard(
            id=self._engine.model_name,
            created=self._engine.started_at,
            image_processor_backend=self._engine.image_processor_backend,
            endpoints=["/v1/encode", "/v1/embeddings"],
        )
        chat = [
            ModelCard(id=name, created=self._engine.started_at, owned_by="upstream", endpoints=["/v1/chat/completions"])
            for name in (self._upstream_models() if self._upstream_models is not None else [])
            if name != encoder.id
        ]
        return ModelList(data=[*chat, encoder])


def _item(source: str, modality: str | None) -> Item:
    """An input as an item: a video or audio clip when the request says so or its data URI is one, else an image."""
    if modality == "video" or source[:11].lower() == "data:video/":
        return VideoItem(file=source)
    if modality == "audio" or source[:11].lower() == "data:audio/":
        return AudioItem(file=source)
    return ImageItem(file=source)


def l2_normalised_mean(rows: torch.Tensor) -> np.ndarray:
    """One vector per image: the mean of its rows, scaled to unit length."""
    mean = rows.mean(dim=0)
    return torch.nn.functional.normalize(mean, dim=0).numpy()
