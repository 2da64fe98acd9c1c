"""``POST /v1/encode``: images (or precomputed embeddings) in, per-item embedding rows and metadata out."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.json_schema import SkipJsonSchema

EmbeddingDType = Literal["float32", "float16", "bfloat16"]
EncodingFormat = Literal["base64", "float", "pt", "npy", "safetensors"]
# Bytes of a multipart file part (`items[0].precomputed_embedding`, `items[0].image`) put where the
# JSON would carry text; never from a JSON body, so left out of the JSON schema.
FilePart = SkipJsonSchema[bytes]
Source = Literal["encoder", "precomputed", "cache"]
PositiveInt = Annotated[int, Field(ge=1)]


class PrecomputedEmbedding(BaseModel):
    model_config = ConfigDict(extra="forbid")

    data: str | list[list[float]] | FilePart = Field(
        description="Base64 of the little-endian bytes of a row-major `shape` array of `dtype`, or nested rows. "
        "In a multipart request: omitted, and the raw bytes sent as the file part "
        "`items[<index>].precomputed_embedding`."
    )
    dtype: EmbeddingDType = "float32"
    shape: Annotated[list[PositiveInt], Field(min_length=2, max_length=2)] = Field(description="[rows, width]")


def _has(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": [name], "properties": {name: schema}}


_STRING, _NUMBER, _INTEGER = {"type": "string"}, {"type": "number"}, {"type": "integer"}
_FRAMES: dict[str, Any] = {"type": "array"}
_VIDEO: dict[str, Any] = {"type": ["string", "array"]}  # a file, or a list of frames
# What `_has_a_source` refuses, said in the JSON schema too (each a combination of fields set).
_CONTRADICTIONS: list[Any] = [
    {"allOf": [_has(a, kind_a), _has(b, kind_b)]}
    for (a, kind_a), (b, kind_b) in (
        (("image", _STRING), ("hash", _STRING)),
        (("video", _VIDEO), ("hash", _STRING)),
        (("image", _STRING), ("video", _VIDEO)),
        (("audio", _STRING), ("hash", _STRING)),
        (("audio", _STRING), ("image", _STRING)),
        (("audio", _STRING), ("video", _VIDEO)),
    )
] + [
    {"allOf": [_has("fps", _NUMBER), _has("num_frames", _INTEGER)]},
    {"allOf": [_has("fps", _NUMBER), {"not": _has("video", _VIDEO)}]},
    {"allOf": [_has("num_frames", _INTEGER), {"not": _has("video", _STRING)}]},
    {"allOf": [_has("video", _FRAMES), {"not": _has("fps", _NUMBER)}]},
    {"allOf": [_has("sampling", _STRING), {"not": _has("video", _STRING)}]},
    {"allOf": [_has("image", _STRING), _has("modality", {"const": "video"})]},
    {"allOf": [_has("video", _VIDEO), _has("modality", {"const": "image"})]},
    {"allOf": [_has("image", _STRING), _has("modality", {"const": "audio"})]},
    {"allOf": [_has("video", _VIDEO), _has("modality", {"const": "audio"})]},
    {"allOf": [_has("audio", _STRING), _has("modality", {"enum": ["image", "video"]})]},
]


class EncodeItem(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        # What `_has_a_source` checks, said in the JSON schema too: at least one source, not null, and
        # none of the contradictions above.
        json_schema_extra={
            "anyOf": [
                _has(name, kind)
                for name, kind in (
                    ("image", _STRING),
                    ("video", _VIDEO),
                    ("audio", _STRING),
                    ("hash", _STRING),
                    ("precomputed_embedding", {"type": "object"}),
                )
            ],
            "not": {"anyOf": _CONTRADICTIONS},
        },
    )

    image: str | FilePart | None = Field(
        default=None,
        description="A data URI, bare base64 of the file, or an http(s) URL. In a multipart request: "
        "omitted, and the file sent as the part `items[<index>].image`.",
        min_length=1,
    )
    video: str | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] | FilePart | None = Field(
        default=None,
        description="A video file (mp4, webm, mkv): a data URI, bare base64 of the file, or an http(s) URL. Or the "
        "clip's frames, already sampled: a list of images (each as `image` takes one), all of one size, taken "
        "whole, with `fps` the rate they were sampled at. In a multipart request: omitted, and the file sent as "
        "the part `items[<index>].video` (frame lists go in JSON). Models with a video processor only (Qwen2-VL, "
        "Qwen2.5-VL, Qwen3-VL, Qwen3.5).",
        min_length=1,
    )
    audio: str | FilePart | None = Field(
        default=None,
        description="An audio file (wav, flac, mp3, ogg): a data URI, bare base64 of the file, or an http(s) URL. "
        "In a multipart request: omitted, and the file sent as the part `items[<index>].audio`. Mono or stereo "
        "(averaged), resampled to the feature extractor's rate. Audio models only (Qwen2-Audio, Qwen2.5-Omni, "
        "Qwen3-Omni).",
        min_length=1,
    )
    fps: float | None = Field(
        default=None,
        gt=0,
        le=240,
        description="Video file: sample this many frames per second of the clip, instead of the checkpoint's "
        "video processor's own rule (Qwen2-VL's: every frame). Frame list (required there): the rate its "
        "frames were sampled at, which the timing metadata is computed from.",
    )
    num_frames: PositiveInt | None = Field(
        default=None,
        description="Video file only: sample this many frames, evenly spread (instead of `fps`).",
    )
    sampling: Literal["checkpoint", "sglang"] | None = Field(
        default=None,
        description="Video file only: whose frame sampling to follow. `checkpoint`: its transformers video "
        "processor's (with `fps` or `num_frames` as that processor's arguments). `sglang`: SGLang 0.5.23's own "
        "when it decodes a clip itself (2 frames a second floored to an even count, or `fps` / `num_frames` as "
        "its video settings; frames resized to its per-clip pixel budget first). Default: the server's "
        "`--video-sampling` (`checkpoint` unless set).",
    )
    modality: Literal["image", "video", "audio"] | None = Field(
        default=None,
        description="What the item is; needed only beside a `precomputed_embedding` of a video or audio clip, to "
        "check its metadata (`video_grid_thw`, `audio_feature_length`). Items with `image`, `video` or `audio` say "
        "it by that field.",
    )
    precomputed_embedding: PrecomputedEmbedding | None = None
    metadata: dict[str, Any] = Field(
        default_factory=dict,
        description="Model metadata such as `image_grid_thw` or `num_patches`; required with a precomputed embedding.",
    )
    hash: str | None = Field(
        default=None,
        description="The `hash` of an earlier response item, to reuse its embedding without sending the image.",
        min_length=1,
        max_length=128,
    )

    @model_validator(mode="after")
    def _has_a_source(self) -> EncodeItem:
        given = [name for name in ("image", "video", "audio") if getattr(self, name) is not None]
        if not given and self.precomputed_embedding is None and self.hash is None:
            raise ValueError("an item needs `image`, `video`, `audio`, `hash` or `precomputed_embedding`")
        if len(given) > 1:
            raise ValueError(f"an item is one `{given[0]}` or one `{given[1]}`, not both: send them as two items")
        media = given[0] if given else None
        if media is not None and self.hash is not None:
            # Silently preferring one would hide a client bug (a stale hash, or a file sent in vain).
            raise ValueError(
                f"an item takes `{media}` or `hash`, not both: `hash` alone reuses an earlier result without "
                f"sending the {media} again; drop one of them"
            )
        if media is not None and self.modality is not None and self.modality != media:
            raise ValueError(f"`modality` {self.modality!r} contradicts the item's `{media}`")
        if self.fps is not None and self.num_frames is not None:
            raise ValueError("`fps` and `num_frames` both choose a video's frames: give one of them")
        if (self.fps is not None or self.num_frames is not None) and self.video is None:
            raise ValueError("`fps` and `num_frames` choose a video's frames: they go with `video` only")
        if self.sampling is not None and (self.video is None or isinstance(self.video, list)):
            raise ValueError("`sampling` chooses a video file's frames: it goes with a `video` file only")
        if isinstance(self.video, list):
            if self.num_frames is not None:
                raise ValueError("a frame list is taken whole: `num_frames` applies to a video file only")
            if self.fps is None:
                raise ValueError(
                    "a frame list needs `fps`, the rate its frames were sampled at: the model places them in time by it"
                )
        return self


class EcTransferItem(BaseModel):
    model_config = ConfigDict(extra="forbid")

    transfer_id: str = Field(
        min_length=1,
        max_length=256,
        description="The id this item's push goes under, as the chat request to the consumer will name it.",
    )


class EcTransferParams(BaseModel):
    """Where to push the rows: a vLLM ``ECMooncakeConnector`` consumer, as vLLM's own proxy tells its encoder."""

    model_config = ConfigDict(extra="forbid")

    consumer_zmq: str = Field(
        min_length=1,
        description="The consumer's control address, `tcp://host:port` (its ec_transfer_config's `ec_ip` and "
        "`ec_port`); one the server allows (`--ec-push-consumers`).",
    )
    ec_items: list[EcTransferItem] | None = Field(
        default=None,
        description="One per item, in order: each item's `transfer_id`, unique. Unset: the server makes them.",
    )


class EncodeOptions(BaseModel):
    """Everything but the items: the JSON body's other fields, or a multipart upload's text fields."""

    model_config = ConfigDict(
        extra="forbid",
        # What `_npy_has_no_bfloat16` and `_pushes_whole_rows` check, said in the JSON schema too: a body the
        # document allows is never a validation_error.
        json_schema_extra={
            "not": {
                "anyOf": [
                    {
                        "required": ["encoding_format", "dtype"],
                        "properties": {"encoding_format": {"const": "npy"}, "dtype": {"const": "bfloat16"}},
                    },
                    {
                        "required": ["ec_transfer_params", "pooling"],
                        "properties": {"ec_transfer_params": {"type": "object"}, "pooling": {"const": "mean"}},
                    },
                    {
                        "required": ["ec_transfer_params", "encoding_format"],
                        "properties": {
                            "ec_transfer_params": {"type": "object"},
                            "encoding_format": {"const": "safetensors"},
                        },
                    },
                ]
            }
        },
    )

    model: str | None = Field(default=None, description="If given, it must name the served model.")
    precomputed: Literal["strict", "fill"] = Field(
        default="strict",
        description="`strict`: every item carries an embedding or none does. `fill`: encode the missing ones.",
    )
    encoding_format: EncodingFormat = Field(
        default="base64",
        description="`base64`: little-endian bytes of `dtype`; `float`: JSON numbers; `pt`: base64 of `torch.save` "
        "bytes and `npy`: base64 of `numpy.save` bytes (float32/float16), both as vLLM's `image_embeds` takes them; "
        "`safetensors`: the whole answer as `application/vnd.safetensors` (tensors `items.<index>`, this JSON in "
        "the header). Unset, the `Accept` header chooses between JSON (`base64`) and safetensors.",
    )
    dtype: EmbeddingDType = "float32"
    pooling: Literal["none", "mean"] = Field(default="none", description="`mean`: one row per item, the mean.")
    ec_transfer_params: EcTransferParams | None = Field(
        default=None,
        description="Push every item's rows (in `dtype`: the consumer's model dtype) into this vLLM "
        "ECMooncakeConnector consumer before answering. The answer then carries no rows (`embedding: null`) and "
        "gives the `ec_transfer_params` for the chat request; 503 `ec_push_failed` when the push did not complete.",
    )

    @model_validator(mode="after")
    def _npy_has_no_bfloat16(self) -> EncodeOptions:
        # numpy has no bfloat16 dtype: an `npy` payload could only lie about it.
        if self.encoding_format == "npy" and self.dtype == "bfloat16":
            raise ValueError('`npy` carries float32 or float16; use "pt" for bfloat16')
        return self

    @model_validator(mode="after")
    def _pushes_whole_rows(self) -> EncodeOptions:
        # A push carries every row and answers JSON without them: a pooled or binary answer would say otherwise.
        if self.ec_transfer_params is not None:
            if self.pooling != "none":
                raise ValueError("`ec_transfer_params` pushes every row: it takes no `pooling`")
            if self.encoding_format == "safetensors":
                raise ValueError("`ec_transfer_params` answers JSON without rows: it takes no `safetensors` format")
        return self


class EncodeRequest(EncodeOptions):
    items: list[EncodeItem] = Field(min_length=1)


class Embedding(BaseModel):
    encoding_format: EncodingFormat
    dtype: EmbeddingDType
    shape: list[int]
    data: str | list[list[float]] = Field(
        description="The rows as `encoding_format` writes them; in a safetensors answer's header, the name of the "
        "item's tensor (`items.<index>`)."
    )


class EncodedItem(BaseModel):
    index: int
    source: Source
    hash: str | None = Field(description="Content hash of the image on this model; null for precomputed items.")
    num_tokens: int = Field(description="Rows the language model reserves for this item.")
    metadata: dict[str, Any]
    embedding: Embedding | None = Field(
        description="The rows; null when the request pushed them (`ec_transfer_params`)."
    )
    ec_cache_path: str | None = Field(
        default=None,
        description="With --ec-shared-storage: the file vLLM's ECExampleConnector reads for this item "
        "(`<dir>/<hash>/encoder_cache.safetensors`), present before this response was sent; "
        "null when the item has no hash or the write failed.",
    )


class EncodeUsage(BaseModel):
    items: int
    tokens: int
    encoded_items: int
    cached_items: int
    precomputed_items: int


class PushedItem(BaseModel):
    mm_hash: str = Field(description="The item's `hash`: vLLM's identifier for it (the chat part's `uuid`).")
    transfer_id: str


class PushedTransfers(BaseModel):
    ec_items: list[PushedItem] = Field(description="One per item, in order.")


class EncodeResponse(BaseModel):
    id: str
    model: str
    items: list[EncodedItem]
    usage: EncodeUsage
    ec_transfer_params: PushedTransfers | None = Field(
        default=None,
        description="With a push: the chat request's `ec_transfer_params` for the consumer, every item's rows "
        "already completed there.",
    )
