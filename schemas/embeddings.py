"""OpenAI-compatible ``POST /v1/embeddings`` and ``GET /v1/models``: OpenAI's own shapes."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

ImageInput = Annotated[
    str,
    Field(
        min_length=1,
        description="An image (or, with `modality` video or a `data:video/` URI, a video; with `modality` audio or "
        "a `data:audio/` URI, an audio clip) URL or data URI.",
    ),
]


class EmbeddingsRequest(BaseModel):
    # OpenAI clients may send fields this service has no use for (``user``...): they are ignored.
    model_config = ConfigDict(extra="ignore")

    model: str
    input: ImageInput | Annotated[list[ImageInput], Field(min_length=1)]
    encoding_format: Literal["float", "base64"] = Field(
        default="float", description="`base64`: little-endian float32 bytes. The openai client asks for it."
    )
    dimensions: int | None = Field(default=None, description="Only the model's own width is supported.")
    modality: Literal["image", "video", "audio"] | None = Field(
        default=None,
        description="`video` (`audio`): every input is a video (an audio clip). Unset or `image`: images, except "
        "`data:video/...` and `data:audio/...` URIs. "
        "Infinity's clients send `image`.",
    )
    user: str | None = None


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingsUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingsUsage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "mmencode"
    # "pil" or "torchvision": which image processor makes the rows (match the LLM server's); null while loading.
    image_processor_backend: str | None = None
    # The routes that take this id as `model`: the encoder's own (/v1/encode, /v1/embeddings), or an upstream's
    # chat model behind the front door (/v1/chat/completions).
    endpoints: list[str] = Field(default_factory=list)


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
