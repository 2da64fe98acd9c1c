"""Property tests of the request parsers: whatever a client sends, only the service's own errors.

Pure functions, no server: data URIs and base64 (``decode_base64_image``), image files
(``decode_image``), client-sent embeddings (``decode_precomputed``) and the ``/v1/encode`` body
(``EncodeRequest``). Each property is bounded so the file runs in seconds; ``derandomize`` keeps
CI's runs reproducible.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import io
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from pydantic import ValidationError

from mmencode.app.engine.errors import InvalidImage, PayloadTooLarge, ServiceError
from mmencode.app.engine.precomputed import decode_precomputed
from mmencode.app.media.image import decode_base64_image, decode_image
from mmencode.schemas.encode import EncodeRequest, PrecomputedEmbedding

BOUNDED = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# ----- decode_base64_image -----

B64_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="
DATA_URI_PREFIXES = [
    "data:image/png;base64,",
    "DATA:IMAGE/JPEG;BASE64,",
    "data:;base64,",
    "data:image/webp;name=a.webp;base64,",
    "data:image/png,",
    "data:text/plain;base64,",
    "data:",
    "data:image/png;base64",
    "",
]
text_sources = st.one_of(
    st.text(max_size=300),
    st.text(alphabet=B64_ALPHABET + " \n\r\t-_:;,.", max_size=300),
    st.tuples(st.sampled_from(DATA_URI_PREFIXES), st.text(alphabet=B64_ALPHABET + " \n-_", max_size=200)).map("".join),
    st.binary(max_size=200).map(lambda raw: base64.b64encode(raw).decode()),
)


@BOUNDED
@given(source=text_sources, max_bytes=st.integers(min_value=1, max_value=400))
def test_decode_base64_image_raises_only_its_own_errors(source: str, max_bytes: int) -> None:
    try:
        data = decode_base64_image(source, max_bytes=max_bytes)
    except (InvalidImage, PayloadTooLarge):
        return
    assert isinstance(data, bytes)
    assert len(data) <= max_bytes


def _with_line_breaks(encoded: str, every: int) -> str:
    return "\n".join(encoded[i : i + every] for i in range(0, len(encoded), every))


@BOUNDED
@given(
    raw=st.binary(min_size=1, max_size=600),
    prefix=st.sampled_from(["", "data:image/png;base64,", "DATA:Image/Png;Base64,", "data:;base64,"]),
    line_length=st.sampled_from([0, 4, 64, 76]),
    slack=st.integers(min_value=0, max_value=8),
)
def test_decode_base64_image_round_trips_real_bytes(raw: bytes, prefix: str, line_length: int, slack: int) -> None:
    encoded = base64.b64encode(raw).decode()
    if line_length:
        encoded = _with_line_breaks(encoded, line_length)  # MIME-style base64
    source = prefix + encoded
    assert decode_base64_image(source, max_bytes=len(raw) + slack) == raw
    with pytest.raises(PayloadTooLarge):
        decode_base64_image(source, max_bytes=len(raw) - 1)


# ----- decode_image -----

# (format, mode) pairs that Pillow can write, so valid files of every kind a client may send exist.
WRITABLE = [
    ("PNG", "RGB"),
    ("PNG", "RGBA"),
    ("PNG", "L"),
    ("PNG", "LA"),
    ("PNG", "P"),
    ("PNG", "1"),
    ("PNG", "I;16"),
    ("JPEG", "RGB"),
    ("JPEG", "L"),
    ("JPEG", "CMYK"),
    ("GIF", "P"),
    ("GIF", "L"),
    ("BMP", "RGB"),
    ("BMP", "L"),
    ("BMP", "P"),
    ("TIFF", "RGB"),
    ("TIFF", "RGBA"),
    ("TIFF", "CMYK"),
    ("TIFF", "I;16"),
    ("TIFF", "I"),
    ("TIFF", "F"),
    ("WEBP", "RGB"),
    ("WEBP", "RGBA"),
]


def _image(mode: str, width: int, height: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    if mode == "F":
        return Image.fromarray(rng.random((height, width)).astype(np.float32))  # 0..1, as float images are
    if mode == "I":
        return Image.fromarray(rng.integers(0, 70_000, (height, width)).astype(np.int32))  # past 16 bits
    if mode == "I;16":
        return Image.frombytes(mode, (width, height), rng.integers(0, 65_536, (height, width)).astype("<u2").tobytes())
    return Image.fromarray(rng.integers(0, 256, (height, width, 4), dtype=np.uint8)).convert(mode)


def _file(image: Image.Image, fmt: str) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt)
    return buffer.getvalue()


@st.composite
def image_files(draw: st.DrawFn) -> tuple[bytes, str, str, int, int]:
    fmt, mode = draw(st.sampled_from(WRITABLE))
    width, height = draw(st.integers(1, 24)), draw(st.integers(1, 24))
    image = _image(mode, width, height, seed=draw(st.integers(0, 2**16)))
    return _file(image, fmt), fmt, mode, width, height


@st.composite
def damaged_files(draw: st.DrawFn) -> bytes:
    """A real file cut short, with bytes overwritten: the decoders' header and chunk parsers see it."""
    data = bytearray(draw(image_files())[0])
    for _ in range(draw(st.integers(0, 6))):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data[: draw(st.just(len(data)) | st.integers(0, len(data)))])


@BOUNDED
@given(data=st.one_of(st.binary(max_size=512), damaged_files()), max_pixels=st.sampled_from([64, 4096, 40_000]))
def test_decode_image_raises_only_its_own_errors(data: bytes, max_pixels: int) -> None:
    try:
        image = decode_image(data, max_pixels=max_pixels)
    except (InvalidImage, PayloadTooLarge):
        return
    assert image.mode == "RGB"
    assert image.width * image.height <= max_pixels


@BOUNDED
@given(file=image_files())
def test_decode_image_gives_rgb_of_the_same_size(file: tuple[bytes, str, str, int, int]) -> None:
    data, fmt, mode, width, height = file
    image = decode_image(data, max_pixels=width * height)
    assert image.mode == "RGB"
    assert image.size == (width, height)
    if (fmt, mode) in (("PNG", "RGB"), ("BMP", "RGB"), ("TIFF", "RGB")):
        # Lossless RGB comes back exactly.
        assert image.tobytes() == Image.open(io.BytesIO(data)).convert("RGB").tobytes()
    if width * height > 1:
        with pytest.raises(PayloadTooLarge):
            decode_image(data, max_pixels=width * height - 1)


# ----- decode_precomputed -----

DTYPES = ["float32", "float16", "bfloat16"]
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
MAX_EMBEDDING_BYTES = 4096
floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=-1e4, max_value=1e4),
    st.sampled_from([0.0, -0.0, 1e39, -1e39, 3.4e38, 1e-45]),
)


@st.composite
def embeddings(draw: st.DrawFn) -> PrecomputedEmbedding:
    """Valid wire objects whose data may or may not fit their shape and dtype."""
    rows = draw(st.one_of(st.integers(1, 6), st.integers(1, 2**40)))
    width = draw(st.one_of(st.integers(1, 6), st.integers(1, 2**40)))
    dtype = draw(st.sampled_from(DTYPES))
    small_rows, small_width = min(rows, 8), min(width, 8)
    data: Any = draw(
        st.one_of(
            # bytes of the declared size (most often), or of any size
            st.binary(
                min_size=small_rows * small_width * ITEMSIZE[dtype], max_size=small_rows * small_width * ITEMSIZE[dtype]
            ).map(lambda raw: base64.b64encode(raw).decode()),
            st.binary(max_size=80).map(lambda raw: base64.b64encode(raw).decode()),
            st.text(alphabet=B64_ALPHABET + " \n-_", max_size=80),
            st.text(max_size=40),
            # nested rows: the declared shape, or ragged
            st.lists(
                st.lists(floats, min_size=small_width, max_size=small_width), min_size=small_rows, max_size=small_rows
            ),
            st.lists(st.lists(floats, max_size=8), max_size=8),
        )
    )
    return PrecomputedEmbedding.model_validate({"data": data, "dtype": dtype, "shape": [rows, width]})


@BOUNDED
@given(embedding=embeddings())
def test_decode_precomputed_gives_the_declared_shape_or_a_service_error(embedding: PrecomputedEmbedding) -> None:
    try:
        tensor = decode_precomputed(embedding, index=0, max_bytes=MAX_EMBEDDING_BYTES)
    except ServiceError as error:
        assert error.status in (400, 413, 422), error
        return
    assert isinstance(tensor, torch.Tensor)
    assert tensor.dtype == torch.float32
    assert list(tensor.shape) == embedding.shape
    assert bool(torch.isfinite(tensor).all())


@BOUNDED
@given(
    rows=st.integers(1, 8),
    width=st.integers(1, 8),
    dtype=st.sampled_from(DTYPES),
    as_list=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_decode_precomputed_round_trips_finite_values(
    rows: int, width: int, dtype: str, as_list: bool, seed: int
) -> None:
    values = torch.from_numpy(np.random.default_rng(seed).normal(0, 100, (rows, width)).astype(np.float32))
    wire_dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    expected = values.to(wire_dtype).float()  # what the wire dtype can carry
    if as_list:
        data: Any = expected.tolist()
    elif dtype == "bfloat16":
        data = base64.b64encode(expected.to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tobytes()).decode()
    else:
        data = base64.b64encode(expected.numpy().astype("<f4" if dtype == "float32" else "<f2").tobytes()).decode()
    embedding = PrecomputedEmbedding.model_validate({"data": data, "dtype": dtype, "shape": [rows, width]})
    tensor = decode_precomputed(embedding, index=0, max_bytes=MAX_EMBEDDING_BYTES)
    assert torch.equal(tensor, expected)


# ----- EncodeRequest -----


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.lists(children, max_size=4), st.dictionaries(st.text(max_size=10), children, max_size=4))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    _containers,
    max_leaves=20,
)


@st.composite
def _fields(
    draw: st.DrawFn, fields: dict[str, st.SearchStrategy[Any]], required: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Mostly plausible dicts with the schema's own keys; sometimes one value is any JSON, one key is
    unknown, or one is missing, so both sides of every validation rule are reached."""
    body: dict[str, Any] = draw(
        st.fixed_dictionaries(
            {key: fields[key] for key in required},
            optional={key: value for key, value in fields.items() if key not in required},
        )
    )
    tweak = draw(st.sampled_from(["none", "none", "none", "junk", "unknown", "drop"]))
    if tweak == "junk":
        body[draw(st.sampled_from(sorted(fields)))] = draw(json_values)
    elif tweak == "unknown":
        body[draw(st.text(min_size=1, max_size=6))] = draw(json_values)
    elif tweak == "drop" and body:
        del body[draw(st.sampled_from(sorted(body)))]
    return body


positive_ints = st.integers(-2, 6) | st.integers(2**31, 2**63)
precomputed_like = _fields(
    {
        "data": st.text(alphabet=B64_ALPHABET, max_size=24) | st.lists(st.lists(floats, max_size=3), max_size=3),
        "dtype": st.sampled_from([*DTYPES, "float64", "FLOAT32"]),
        "shape": st.lists(positive_ints, max_size=3),
    }
)
ITEM_FIELDS = {
    "image": st.text(min_size=1, max_size=12) | st.none(),
    "hash": st.text(min_size=1, max_size=130) | st.none(),
    "metadata": st.dictionaries(st.sampled_from(["image_grid_thw", "num_patches", "x"]), json_values),
    "precomputed_embedding": st.none() | precomputed_like,
}
items_like = st.lists(_fields(ITEM_FIELDS, required=("image",)) | _fields(ITEM_FIELDS), min_size=1, max_size=4)
requests_like = _fields(
    {
        "model": st.none() | st.text(max_size=8),
        "items": items_like,
        "precomputed": st.sampled_from(["strict", "fill"]),
        "encoding_format": st.sampled_from(["base64", "float"]),
        "dtype": st.sampled_from(DTYPES),
        "pooling": st.sampled_from(["none", "mean"]),
    },
    required=("items",),
)


@BOUNDED
@given(body=st.one_of(json_values, requests_like))
def test_encode_request_validation_raises_only_validation_error(body: Any) -> None:
    try:
        request = EncodeRequest.model_validate(body)
    except ValidationError:
        return
    assert request.items
    assert all(i.image is not None or i.hash is not None or i.precomputed_embedding for i in request.items)


@functools.cache
def _documented_schema() -> Any:
    """A validator of EncodeRequest's JSON schema, as /openapi.json publishes it."""
    jsonschema_rs = pytest.importorskip("jsonschema_rs")  # comes with schemathesis
    return jsonschema_rs.validator_for(EncodeRequest.model_json_schema())


@BOUNDED
@given(body=requests_like)
def test_what_the_documented_schema_accepts_validates(body: Any) -> None:
    """The document never promises more than the service takes: schema-valid means model-valid."""
    if _documented_schema().is_valid(body):
        EncodeRequest.model_validate(body)


@BOUNDED
@given(raw=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode)))
def test_encode_request_json_parsing_raises_only_validation_error(raw: bytes) -> None:
    with contextlib.suppress(ValidationError):
        EncodeRequest.model_validate_json(raw)


def test_the_strategies_reach_success() -> None:
    """Guard against strategies that only ever produce errors: each parser accepts a plain good input."""
    good = _file(_image("RGB", 3, 2, seed=0), "PNG")
    assert decode_base64_image("data:image/png;base64," + base64.b64encode(good).decode(), max_bytes=10_000) == good
    assert decode_image(good, max_pixels=6).size == (3, 2)
    rows = decode_precomputed(
        PrecomputedEmbedding(data=[[1.0, 2.0]], shape=[1, 2]), index=0, max_bytes=MAX_EMBEDDING_BYTES
    )
    assert rows.tolist() == [[1.0, 2.0]]
    assert EncodeRequest.model_validate({"items": [{"image": "x"}]}).items[0].image == "x"
