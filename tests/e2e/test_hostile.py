"""A corpus of hostile and unusual inputs against the live server: each gets its documented code and
status in the one error shape (never a 500), real-world image files encode as the pixels they show,
and the service still serves good requests correctly afterwards.

Every image is generated here with Pillow and numpy.
"""

from __future__ import annotations

import base64
import io
import json
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from PIL import Image, PngImagePlugin
from prometheus_client.parser import text_string_to_metric_families

from mmencode.models import load_encoder
from tests.helpers import LiveServer, assert_error, image_bytes, live_server, noise_image, precomputed, rows_of

WIDTH = 64  # the tiny Qwen2-VL's row width (after the merger)
GOOD = noise_image(84, 56, seed=101)


# ---------------------------------------------------------------- building blocks


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{b64(data)}"


def save(image: Image.Image, fmt: str, **params: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **params)
    return buffer.getvalue()


def grey(value: int, size: tuple[int, int] = (56, 56)) -> Image.Image:
    return Image.new("RGB", size, (value, value, value))


def decoded_rgb(data: bytes) -> Image.Image:
    """What any correct decoder shows for an opaque file: Pillow's pixels, as RGB."""
    return Image.open(io.BytesIO(data)).convert("RGB")


def internal_errors(server: LiveServer) -> float:
    with server.client() as client:
        text = client.get("/metrics").text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "mmencode_errors_total" and sample.labels.get("code") == "internal_error"
    )


def set_png_size(png: bytes, width: int, height: int) -> bytes:
    """The same PNG with IHDR claiming another size (CRC fixed up): a header-only decompression bomb."""
    assert png[12:16] == b"IHDR"
    body = b"IHDR" + struct.pack(">II", width, height) + png[24:29]
    return png[:8] + png[8:12] + body + struct.pack(">I", zlib.crc32(body)) + png[33:]


def tiff_with_bad_strip_offsets() -> bytes:
    """A TIFF whose StripOffsets tag has type UNDEFINED: Pillow's loader raised TypeError on it."""
    data = bytearray(save(noise_image(60, 40, seed=7), "TIFF"))
    assert data[:4] == b"II*\x00"
    ifd = struct.unpack_from("<I", data, 4)[0]
    (count,) = struct.unpack_from("<H", data, ifd)
    for k in range(count):
        entry = ifd + 2 + 12 * k
        if struct.unpack_from("<H", data, entry)[0] == 273:  # StripOffsets
            struct.pack_into("<H", data, entry + 2, 7)
            return bytes(data)
    raise AssertionError("no StripOffsets tag")


def png_with_text_bomb() -> bytes:
    """A small PNG carrying a compressed text chunk that inflates to 16 MiB (Pillow stops at 1 MiB)."""
    info = PngImagePlugin.PngInfo()
    info.add_itxt("comment", "A" * (16 * 1024 * 1024), zip=True)
    return save(Image.new("RGB", (8, 8)), "PNG", pnginfo=info)


def post_encode(client: httpx.Client, *items: dict[str, Any], **options: Any) -> httpx.Response:
    return client.post("/v1/encode", json={"items": list(items), **options})


@pytest.fixture(scope="module", autouse=True)
def internal_errors_before(qwen_server: LiveServer) -> float:
    """The main server's count of 500s before this corpus (other modules share the server)."""
    return internal_errors(qwen_server)


# ---------------------------------------------------------------- 1. images as people send them


@dataclass(frozen=True)
class Good:
    source: str  # what the client sends as `image`
    reference: Image.Image  # the RGB pixels the service must encode


_NOISE = noise_image(84, 56, seed=1)
_PNG_NOISE = save(_NOISE, "PNG")


def _cases_real_world() -> dict[str, Callable[[], Good]]:
    noise = _NOISE

    def lossy(fmt: str, mime: str, image: Image.Image = noise, **params: Any) -> Good:
        data = save(image, fmt, **params)
        return Good(uri(data, mime), decoded_rgb(data))

    def lossless(fmt: str, mime: str, image: Image.Image = noise, **params: Any) -> Good:
        return Good(uri(save(image, fmt, **params), mime), image.convert("RGB"))

    def animated_gif() -> Good:
        red, blue = Image.new("RGB", (56, 56), (255, 0, 0)), Image.new("RGB", (56, 56), (0, 0, 255))
        data = save(red, "GIF", save_all=True, append_images=[blue], duration=100, loop=0)
        assert Image.open(io.BytesIO(data)).n_frames == 2
        return Good(uri(data, "image/gif"), red)  # the first frame

    def grey16(fmt: str) -> Good:
        # Mid-grey in 16 bits must encode as mid-grey in 8 bits, not clip to white.
        image = Image.fromarray(np.full((56, 56), 32768, dtype=np.uint16))
        data = save(image, fmt)
        assert Image.open(io.BytesIO(data)).mode.startswith("I;16")
        return Good(uri(data, f"image/{fmt.lower()}"), grey(128))

    def grey32(mode: str, value: float) -> Good:
        dtype = np.int32 if mode == "I" else np.float32
        data = save(Image.fromarray(np.full((56, 56), value, dtype=dtype), mode=mode), "TIFF")
        assert Image.open(io.BytesIO(data)).mode == mode
        return Good(uri(data, "image/tiff"), grey(128))

    def palette_transparent() -> Good:
        image = Image.new("P", (56, 56), 0)
        image.putpalette([255, 0, 0, 0, 255, 0] + [0] * 762)
        image.paste(1, (28, 0, 56, 56))
        data = save(image, "PNG", transparency=0)  # index 0 (red) is transparent
        reference = Image.new("RGB", (56, 56), (255, 255, 255))
        reference.paste((0, 255, 0), (28, 0, 56, 56))
        return Good(uri(data), reference)

    def rgba(alpha: int) -> Good:
        array = np.asarray(noise_image(56, 56, seed=3, mode="RGBA")).copy()
        array[..., 3] = alpha
        image = Image.fromarray(array, mode="RGBA")
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Good(uri(save(image, "PNG")), Image.alpha_composite(white, image).convert("RGB"))

    def grey_alpha_transparent() -> Good:
        image = Image.merge("LA", [noise_image(56, 56, seed=4, mode="L"), Image.new("L", (56, 56), 0)])
        return Good(uri(save(image, "PNG")), grey(255))

    def exif_rotated() -> Good:
        # Stored 84x56 landscape, EXIF says "rotate 90 clockwise to display": shown as 56x84 portrait.
        exif = Image.Exif()
        exif[0x0112] = 6
        data = save(noise, "JPEG", exif=exif, quality=95)
        upright = Image.open(io.BytesIO(data)).convert("RGB").transpose(Image.Transpose.ROTATE_270)
        assert upright.size == (56, 84)
        return Good(uri(data, "image/jpeg"), upright)

    def mpo() -> Good:
        first = noise_image(56, 56, seed=5)
        data = save(first, "MPO", save_all=True, append_images=[noise_image(56, 56, seed=6)])
        assert Image.open(io.BytesIO(data)).format == "MPO"
        return Good(uri(data, "image/jpeg"), decoded_rgb(data))

    def with_line_breaks() -> Good:
        text = b64(save(noise, "PNG"))
        wrapped = "\n".join(text[i : i + 76] for i in range(0, len(text), 76))  # MIME-style base64
        return Good("data:image/png;base64," + wrapped, noise)

    return {
        "png_rgb": lambda: lossless("PNG", "image/png"),
        "png_bare_base64": lambda: Good(b64(save(noise, "PNG")), noise),
        "png_base64_with_line_breaks": with_line_breaks,
        "png_data_uri_with_parameter": lambda: Good(
            "data:image/png;name=a.png;base64," + b64(save(noise, "PNG")), noise
        ),
        "png_sent_as_image_jpeg": lambda: lossless("PNG", "image/jpeg"),
        "png_data_uri_without_media_type": lambda: lossless("PNG", ""),
        "png_1x1": lambda: lossless("PNG", "image/png", Image.new("RGB", (1, 1), (9, 99, 199))),
        "jpeg_rgb": lambda: lossy("JPEG", "image/jpeg"),
        "jpeg_progressive": lambda: lossy("JPEG", "image/jpeg", progressive=True, quality=90),
        "jpeg_cmyk": lambda: lossy("JPEG", "image/jpeg", noise.convert("CMYK")),
        "jpeg_grey": lambda: lossy("JPEG", "image/jpeg", noise.convert("L")),
        "jpeg_exif_orientation_6": exif_rotated,
        "mpo": mpo,
        "webp_lossless": lambda: lossless("WEBP", "image/webp", lossless=True),
        "webp_lossy": lambda: lossy("WEBP", "image/webp", quality=80),
        "gif_animated_first_frame": animated_gif,
        "bmp": lambda: lossless("BMP", "image/bmp"),
        "tiff": lambda: lossless("TIFF", "image/tiff"),
        "tiff_lzw": lambda: lossless("TIFF", "image/tiff", compression="tiff_lzw"),
        "png_16bit_grey_mid": lambda: grey16("PNG"),
        "tiff_16bit_grey_mid": lambda: grey16("TIFF"),
        "tiff_int32_grey_mid": lambda: grey32("I", 32768),
        "tiff_float_grey_mid": lambda: grey32("F", 0.5),
        "png_palette": lambda: lossless("PNG", "image/png", noise.convert("P")),
        "png_palette_transparency": palette_transparent,
        "png_grey_L": lambda: lossless("PNG", "image/png", noise.convert("L")),
        "png_bilevel_1": lambda: lossless("PNG", "image/png", noise.convert("1")),
        "png_grey_alpha_transparent": grey_alpha_transparent,
        "png_rgba_opaque": lambda: rgba(255),
        "png_rgba_fully_transparent_is_white": lambda: Good(uri(save(_transparent(), "PNG")), grey(255)),
        "png_rgba_half_transparent": lambda: rgba(128),
    }


def _transparent() -> Image.Image:
    array = np.asarray(noise_image(56, 56, seed=2, mode="RGBA")).copy()
    array[..., 3] = 0  # colours everywhere, all invisible
    return Image.fromarray(array, mode="RGBA")


REAL_WORLD = _cases_real_world()


@pytest.mark.parametrize("case", list(REAL_WORLD))
def test_real_world_images_encode_as_the_pixels_they_show(qwen_server: LiveServer, case: str) -> None:
    good = REAL_WORLD[case]()
    with qwen_server.client() as client:
        response = post_encode(client, {"image": good.source}, {"image": uri(image_bytes(good.reference))})
    assert response.status_code == 200, response.text
    got, want = response.json()["items"]
    t, h, w = got["metadata"]["image_grid_thw"]
    assert got["num_tokens"] == t * h * w // 4 and got["embedding"]["shape"] == [got["num_tokens"], WIDTH]
    assert got["metadata"] == want["metadata"]
    rows = rows_of(got)
    assert bool(torch.isfinite(rows).all())
    torch.testing.assert_close(rows, rows_of(want), atol=1e-4, rtol=1e-4)


def test_exif_orientation_changes_the_grid(qwen_server: LiveServer) -> None:
    """An EXIF-rotated landscape is encoded as the portrait it displays as, not as stored."""
    stored = noise_image(140, 56, seed=8)
    exif = Image.Exif()
    exif[0x0112] = 6
    with qwen_server.client() as client:
        response = post_encode(
            client, {"image": uri(save(stored, "JPEG", exif=exif))}, {"image": uri(save(stored, "JPEG"))}
        )
    assert response.status_code == 200, response.text
    rotated, plain = (item["metadata"]["image_grid_thw"] for item in response.json()["items"])
    assert rotated[0] == plain[0] and rotated[1:] == plain[:0:-1] and rotated != plain


def test_sixteen_bit_grey_is_not_clipped_to_white(qwen_server: LiveServer) -> None:
    mid16 = uri(save(Image.fromarray(np.full((56, 56), 32768, dtype=np.uint16)), "PNG"))
    with qwen_server.client() as client:
        response = post_encode(client, {"image": mid16}, {"image": uri(save(grey(255), "PNG"))})
    assert response.status_code == 200, response.text
    mid, white = (rows_of(item) for item in response.json()["items"])
    assert not torch.allclose(mid, white, atol=1e-3)


# ---------------------------------------------------------------- 2. images that are not images


def _polyglot_gif_html() -> bytes:
    # A 1x1 GIF header whose body is an HTML page with a script.
    return b"GIF89a\x01\x00\x01\x00\x00\x00\x00<html><script>alert(document.cookie)</script></html>"


_PNG = save(noise_image(64, 48, seed=9), "PNG")
_JPEG = save(noise_image(64, 48, seed=9), "JPEG")


def _bad_crc(png: bytes) -> bytes:
    data = bytearray(png)
    data[29] ^= 0xFF  # the IHDR CRC
    return bytes(data)


INVALID_IMAGES: dict[str, Callable[[], str]] = {
    "truncated_png": lambda: uri(_PNG[: len(_PNG) // 2]),
    "truncated_jpeg": lambda: uri(_JPEG[: len(_JPEG) // 2], "image/jpeg"),
    "png_signature_only": lambda: uri(_PNG[:8]),
    "png_signature_then_garbage": lambda: uri(_PNG[:8] + b"garbage!" * 64),
    "png_bad_header_crc": lambda: uri(_bad_crc(_PNG)),
    "jpeg_header_then_html": lambda: uri(_JPEG[:20] + b"<html><body>hi</body></html>", "image/jpeg"),
    "gif_header_then_html_polyglot": lambda: uri(_polyglot_gif_html(), "image/gif"),
    "tiff_corrupt_strip_offsets_tag": lambda: uri(tiff_with_bad_strip_offsets(), "image/tiff"),
    "png_with_compressed_text_bomb": lambda: uri(png_with_text_bomb()),
    "zero_bytes_data_uri": lambda: "data:image/png;base64,",
    "zero_bytes_bare_padding": lambda: "====",
    "one_byte": lambda: b64(b"\x00"),
    "plain_text": lambda: b64(b"just some text, not a picture\n"),
    "html": lambda: uri(b"<!doctype html><html><body><img src=x onerror=alert(1)></body></html>"),
    "svg": lambda: uri(
        b'<svg xmlns="http://www.w3.org/2000/svg" width="64" height="64"><rect width="64" height="64"/></svg>',
        "image/svg+xml",
    ),
    "ico_not_an_allowed_format": lambda: uri(save(noise_image(32, 32), "ICO"), "image/x-icon"),
    "ppm_not_an_allowed_format": lambda: uri(save(noise_image(32, 32), "PPM"), "image/x-portable-pixmap"),
    "invalid_base64_characters": lambda: "iVBORw0KGgo!!!$$$***",
    "base64_with_non_ascii": lambda: "iVBORw0KGgoé" + b64(_PNG)[12:],
    "base64_wrong_length": lambda: b64(_PNG)[:-1].rstrip("="),
    "data_uri_text_html": lambda: "data:text/html;base64," + b64(b"<html></html>"),
    "data_uri_application_json": lambda: "data:application/json;base64," + b64(b"{}"),
    "data_uri_without_base64": lambda: "data:image/png," + b64(_PNG),
    "data_uri_percent_encoded_svg": lambda: (
        "data:image/svg+xml,%3Csvg%20xmlns%3D%22http%3A//www.w3.org/2000/svg%22/%3E"
    ),
    "data_uri_without_comma": lambda: "data:image/png;base64",
    "data_uri_with_quoted_parameter": lambda: 'data:image/png;name="a b.png";base64,' + b64(_PNG),
}


@pytest.mark.parametrize("case", list(INVALID_IMAGES))
def test_bad_images_are_invalid_image_naming_the_item(qwen_server: LiveServer, case: str) -> None:
    with qwen_server.client() as client:
        response = post_encode(client, {"image": uri(image_bytes(GOOD))}, {"image": INVALID_IMAGES[case]()})
    error = assert_error(response, 400, "invalid_image")
    assert error["param"] == "items[1].image"
    assert error["details"]["index"] == 1
    assert error["message"].startswith("item 1:")


@pytest.mark.parametrize("case", ["plain_text", "svg", "truncated_png", "data_uri_text_html"])
def test_bad_images_on_the_openai_route(qwen_server: LiveServer, case: str) -> None:
    with qwen_server.client() as client:
        response = client.post(
            "/v1/embeddings", json={"model": "tiny-qwen2-vl", "input": [uri(image_bytes(GOOD)), INVALID_IMAGES[case]()]}
        )
    error = assert_error(response, 400, "invalid_image")
    assert error["details"]["index"] == 1


@pytest.mark.parametrize("case", ["truncated_png", "html", "gif_header_then_html_polyglot", "svg"])
def test_bad_images_uploaded_as_files(qwen_server: LiveServer, case: str) -> None:
    raw = INVALID_IMAGES[case]()
    data = base64.b64decode(raw.split(",", 1)[1])
    files = [("image", ("good.png", image_bytes(GOOD), "image/png")), ("image", ("bad.png", data, "image/png"))]
    with qwen_server.client() as client:
        response = client.post("/v1/encode", files=files)
    error = assert_error(response, 400, "invalid_image")
    assert error["param"] == "items[1].image" and error["details"]["index"] == 1


def test_empty_image_string_is_a_schema_error(qwen_server: LiveServer) -> None:
    with qwen_server.client() as client:
        encode = post_encode(client, {"image": ""})
        embeddings = client.post("/v1/embeddings", json={"model": "tiny-qwen2-vl", "input": [""]})
    assert assert_error(encode, 422, "validation_error")["param"] == "items[0].image"
    assert_error(embeddings, 422, "validation_error")


@pytest.mark.parametrize(
    "source",
    [
        "file:///etc/passwd",
        "FILE:///etc/passwd",
        "ftp://example.com/cat.png",
        "gopher://127.0.0.1:6379/_INFO",
        "javascript:alert(1)",
        "http://127.0.0.1:1/cat.png",
        "http://[::1]:1/cat.png",
        "http://169.254.169.254/latest/meta-data/",
    ],
    ids=["file", "file_upper", "ftp", "gopher", "javascript", "loopback", "loopback_v6", "cloud_metadata"],
)
def test_urls_that_must_not_be_fetched(qwen_server: LiveServer, source: str) -> None:
    with qwen_server.client() as client:
        response = post_encode(client, {"image": uri(image_bytes(GOOD))}, {"image": source})
    error = assert_error(response, 400, "url_not_allowed")
    assert error["param"] == "items[1].image" and error["details"]["index"] == 1


@pytest.mark.parametrize("size", [(300, 1), (1, 300)], ids=["wide_300x1", "tall_1x300"])
def test_extreme_aspect_ratio_is_a_client_error(limited_server: LiveServer, size: tuple[int, int]) -> None:
    # On the limited server: a 500 here must not count against the main server's clean record.
    with limited_server.client() as client:
        response = post_encode(client, {"image": uri(save(Image.new("RGB", size, (1, 2, 3)), "PNG"))})
    assert 400 <= response.status_code < 500, response.text
    assert_error(response, 400, "invalid_image")


# ---------------------------------------------------------------- bodies that are not requests

_GOOD_URI = uri(image_bytes(GOOD))
MALFORMED_BODIES: dict[str, bytes] = {
    "empty": b"",
    "truncated_json": b'{"items": [{"image": "abc"',
    "array_root": b"[]",
    "null_root": b"null",
    "string_root": b'"items"',
    "deeply_nested": b'{"items": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "not_utf8": b'{"items": [{"image": "\xff\xfe"}]}',
    "utf8_bom": b'\xef\xbb\xbf{"items": [{"image": "x"}]}',
    "lone_surrogate_escape": b'{"model": "\\ud800", "items": [{"image": "' + _GOOD_URI.encode() + b'"}]}',
    "number_out_of_range": b'{"items": [{"precomputed_embedding": {"data": "", "shape": [' + b"9" * 5000 + b", 64]}}]}",
    "exponent_overflow": b'{"items": [{"precomputed_embedding": {"data": "", "shape": [1e999999, 64]}}]}',
    "items_not_a_list": b'{"items": {"image": "x"}}',
    "item_not_an_object": b'{"items": ["x"]}',
}


@pytest.mark.parametrize("case", list(MALFORMED_BODIES))
def test_malformed_json_bodies_are_validation_errors(qwen_server: LiveServer, case: str) -> None:
    with qwen_server.client() as client:
        response = client.post(
            "/v1/encode", content=MALFORMED_BODIES[case], headers={"content-type": "application/json"}
        )
    error = assert_error(response, 422, "validation_error")
    assert error["details"]["errors"], error


@pytest.mark.parametrize("case", ["empty", "truncated_json", "deeply_nested", "not_utf8", "utf8_bom"])
def test_malformed_json_bodies_on_the_openai_route(qwen_server: LiveServer, case: str) -> None:
    # FastAPI parses this route's body; what it cannot parse is a 422 as on /v1/encode.
    with qwen_server.client() as client:
        response = client.post(
            "/v1/embeddings", content=MALFORMED_BODIES[case], headers={"content-type": "application/json"}
        )
    error = assert_error(response, 422, "validation_error")
    assert error["details"]["errors"], error


def test_lone_surrogate_model_name_on_the_openai_route(limited_server: LiveServer) -> None:
    # On the limited server: a 500 here must not count against the main server's clean record.
    body = b'{"model": "\\ud800", "input": ["' + _GOOD_URI.encode() + b'"]}'
    with limited_server.client() as client:
        response = client.post("/v1/embeddings", content=body, headers={"content-type": "application/json"})
    assert 400 <= response.status_code < 500, response.text  # model_not_found, or 422 for the bad escape
    assert_error(response, response.status_code, response.json()["error"]["code"])


MULTIPART_BOUNDARY = {"content-type": "multipart/form-data; boundary=x"}
MALFORMED_MULTIPART: dict[str, tuple[dict[str, str], bytes, int, str]] = {
    "no_boundary": ({"content-type": "multipart/form-data"}, b"--x\r\n", 422, "validation_error"),
    "garbage": (MULTIPART_BOUNDARY, b"garbage", 422, "validation_error"),
    "image_as_text_field": (
        MULTIPART_BOUNDARY,
        b'--x\r\nContent-Disposition: form-data; name="image"\r\n\r\nhello\r\n--x--\r\n',
        422,
        "validation_error",
    ),
    "unknown_field": (
        MULTIPART_BOUNDARY,
        b'--x\r\nContent-Disposition: form-data; name="surprise"\r\n\r\n1\r\n--x--\r\n',
        422,
        "validation_error",
    ),
    "empty_file": (
        MULTIPART_BOUNDARY,
        b'--x\r\nContent-Disposition: form-data; name="image"; filename="a.png"\r\n\r\n\r\n--x--\r\n',
        400,
        "invalid_image",
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED_MULTIPART))
def test_malformed_multipart_bodies(qwen_server: LiveServer, case: str) -> None:
    headers, content, status, code = MALFORMED_MULTIPART[case]
    with qwen_server.client() as client:
        response = client.post("/v1/encode", content=content, headers=headers)
    assert_error(response, status, code)


# ---------------------------------------------------------------- 3. precomputed embeddings


def _f32(values: np.ndarray) -> str:
    return b64(np.asarray(values, dtype="<f4").tobytes())


GRID = [1, 4, 4]  # 4 rows on this model
ROWS = torch.randn(4, WIDTH, generator=torch.Generator().manual_seed(0))


def _pre(embedding: dict[str, Any], metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    item: dict[str, Any] = {"precomputed_embedding": embedding}
    item["metadata"] = {"image_grid_thw": GRID} if metadata is None else metadata
    return item


def _with(**changes: Any) -> dict[str, Any]:
    return {**precomputed(ROWS), **changes}


def _nonfinite(value: float, dtype: str = "float32") -> dict[str, Any]:
    array = ROWS.numpy().copy()
    array[2, 5] = value
    if dtype == "float32":
        return _with(data=_f32(array))
    if dtype == "float16":
        return _with(data=b64(array.astype("<f2").tobytes()), dtype="float16")
    bits = torch.from_numpy(array).to(torch.bfloat16).view(torch.int16).numpy().astype("<i2")
    return _with(data=b64(bits.tobytes()), dtype="bfloat16")


def _nested(value: float) -> str:
    rows = ROWS.tolist()
    rows[1][3] = value
    # Python's json writes NaN / Infinity, which strict JSON does not have.
    return json.dumps({"items": [_pre(_with(data=rows))]})


@dataclass(frozen=True)
class Hostile:
    status: int
    code: str
    items: list[dict[str, Any]] | None = None
    raw: str | None = None  # a body sent as is
    param: str | None = None


PRE = "items[0].precomputed_embedding"
META = "items[0].metadata.image_grid_thw"

PRECOMPUTED: dict[str, Hostile] = {
    "shape_rank_1": Hostile(422, "validation_error", [_pre(_with(shape=[4 * WIDTH]))], param=f"{PRE}.shape"),
    "shape_rank_3": Hostile(422, "validation_error", [_pre(_with(shape=[1, 4, WIDTH]))], param=f"{PRE}.shape"),
    "shape_zero_rows": Hostile(422, "validation_error", [_pre(_with(shape=[0, WIDTH]))]),
    "shape_negative": Hostile(422, "validation_error", [_pre(_with(shape=[-4, WIDTH]))]),
    "shape_not_ints": Hostile(422, "validation_error", [_pre(_with(shape=["4", 64.5]))]),
    "dtype_float64": Hostile(422, "validation_error", [_pre(_with(dtype="float64"))], param=f"{PRE}.dtype"),
    "dtype_int8": Hostile(422, "validation_error", [_pre(_with(dtype="int8"))], param=f"{PRE}.dtype"),
    "unknown_field": Hostile(422, "validation_error", [_pre(_with(scale=2.0))]),
    "data_not_base64": Hostile(422, "validation_error", [_pre(_with(data="not base64!"))], param=f"{PRE}.data"),
    "data_a_number": Hostile(422, "validation_error", [_pre(_with(data=3.0))]),
    "base64_too_short": Hostile(
        400,
        "precomputed_shape_mismatch",
        [_pre(_with(data=_f32(ROWS.numpy()[:, :-1])))],
        param=f"{PRE}.data",
    ),
    "base64_too_long": Hostile(
        400, "precomputed_shape_mismatch", [_pre(_with(data=_f32(np.zeros((5, WIDTH)))))], param=f"{PRE}.data"
    ),
    "base64_float16_length_as_float32": Hostile(
        400,
        "precomputed_shape_mismatch",
        [_pre(_with(data=b64(ROWS.numpy().astype("<f2").tobytes())))],
        param=f"{PRE}.data",
    ),
    "base64_float32_nan": Hostile(422, "validation_error", [_pre(_nonfinite(float("nan")))], param=f"{PRE}.data"),
    "base64_float32_inf": Hostile(422, "validation_error", [_pre(_nonfinite(float("inf")))], param=f"{PRE}.data"),
    "base64_float16_neg_inf": Hostile(422, "validation_error", [_pre(_nonfinite(-float("inf"), "float16"))]),
    "base64_bfloat16_nan": Hostile(422, "validation_error", [_pre(_nonfinite(float("nan"), "bfloat16"))]),
    "nested_nan_literal": Hostile(422, "validation_error", raw=_nested(float("nan")), param=f"{PRE}.data"),
    "nested_infinity_literal": Hostile(422, "validation_error", raw=_nested(float("inf")), param=f"{PRE}.data"),
    "nested_overflows_float32": Hostile(422, "validation_error", raw=_nested(1e39), param=f"{PRE}.data"),
    "nested_ragged_rows": Hostile(
        400,
        "precomputed_shape_mismatch",
        [_pre(_with(data=[[0.0] * WIDTH, [0.0] * (WIDTH - 1), [0.0] * WIDTH, [0.0] * WIDTH]))],
        param=f"{PRE}.data",
    ),
    "nested_too_few_rows": Hostile(
        400, "precomputed_shape_mismatch", [_pre(_with(data=ROWS.tolist()[:3]))], param=f"{PRE}.data"
    ),
    "nested_empty": Hostile(400, "precomputed_shape_mismatch", [_pre(_with(data=[]))], param=f"{PRE}.data"),
    "nested_strings": Hostile(422, "validation_error", [_pre(_with(data=[["a"] * WIDTH] * 4))]),
    "shape_rows_disagree_with_metadata": Hostile(
        400, "precomputed_shape_mismatch", [_pre(_with(shape=[5, WIDTH]))], param=f"{PRE}.shape"
    ),
    "shape_width_not_the_models": Hostile(
        400, "precomputed_shape_mismatch", [_pre(_with(data=_f32(np.zeros((8, 32))), shape=[8, 32]))]
    ),
    "grid_two_values": Hostile(422, "validation_error", [_pre(_with(), {"image_grid_thw": [1, 2]})], param=META),
    "grid_a_string_value": Hostile(
        422, "validation_error", [_pre(_with(), {"image_grid_thw": ["a", 2, 2]})], param=META
    ),
    "grid_not_merge_multiple": Hostile(
        422, "validation_error", [_pre(_with(), {"image_grid_thw": [1, 3, 3]})], param=META
    ),
    "grid_zero": Hostile(422, "validation_error", [_pre(_with(), {"image_grid_thw": [0, 4, 4]})], param=META),
    "grid_floats": Hostile(422, "validation_error", [_pre(_with(), {"image_grid_thw": [1.0, 4.0, 4.0]})], param=META),
    "grid_booleans": Hostile(422, "validation_error", [_pre(_with(), {"image_grid_thw": [True, 4, 4]})], param=META),
    "grid_a_string": Hostile(422, "validation_error", [_pre(_with(), {"image_grid_thw": "1,4,4"})], param=META),
    "grid_nested": Hostile(422, "validation_error", [_pre(_with(), {"image_grid_thw": [[1, 4, 4]]})], param=META),
    "metadata_absent": Hostile(400, "missing_metadata", [{"precomputed_embedding": _with()}], param=META),
    "metadata_empty": Hostile(400, "missing_metadata", [_pre(_with(), {})], param=META),
    "grid_null": Hostile(400, "missing_metadata", [_pre(_with(), {"image_grid_thw": None})], param=META),
    "metadata_not_an_object": Hostile(422, "validation_error", [_pre(_with(), [1, 4, 4])]),  # type: ignore[arg-type]
    "huge_declared_shape_with_matching_grid": Hostile(
        413,
        "payload_too_large",
        [_pre(_with(data="AAAA", shape=[10_000_000, WIDTH]), {"image_grid_thw": [1, 2000, 20000]})],
        param=PRE,
    ),
    "huge_declared_shape_bfloat16": Hostile(
        413,
        "payload_too_large",
        [_pre(_with(data="AAAA", shape=[10_000_000, WIDTH], dtype="bfloat16"), {"image_grid_thw": [1, 2000, 20000]})],
        param=PRE,
    ),
    "huge_declared_shape_other_grid": Hostile(
        400, "precomputed_shape_mismatch", [_pre(_with(data="AAAA", shape=[10_000_000, WIDTH]))], param=f"{PRE}.shape"
    ),
    "second_item_bad": Hostile(
        400,
        "precomputed_shape_mismatch",
        [_pre(_with()), _pre(_with(shape=[3, WIDTH]))],
        param="items[1].precomputed_embedding.shape",
    ),
}


@pytest.mark.parametrize("case", list(PRECOMPUTED))
def test_hostile_precomputed_embeddings(qwen_server: LiveServer, case: str) -> None:
    hostile = PRECOMPUTED[case]
    with qwen_server.client() as client:
        if hostile.raw is not None:
            response = client.post("/v1/encode", content=hostile.raw, headers={"content-type": "application/json"})
        else:
            response = post_encode(client, *(hostile.items or []))
    error = assert_error(response, hostile.status, hostile.code)
    if hostile.param is not None:
        assert error["param"] == hostile.param, error
    if hostile.code == "validation_error":
        assert error["details"]["errors"], error
    if hostile.code == "payload_too_large":
        assert error["details"]["limit"] == "max_body_bytes", error
        assert error["details"]["bytes"] > error["details"]["max_bytes"], error


@pytest.mark.parametrize(
    "metadata",
    [{"image_grid_thw": [1, 2**70, 2]}, {"image_grid_thw": GRID, "note": 2**70}],
    ids=["grid_beyond_64_bits", "extra_metadata_beyond_64_bits"],
)
def test_integers_beyond_64_bits_in_metadata(limited_server: LiveServer, metadata: dict[str, Any]) -> None:
    # On the limited server: a 500 here must not count against the main server's clean record.
    with limited_server.client() as client:
        response = post_encode(client, _pre(_with(), metadata))
    assert response.status_code < 500, response.text
    if response.status_code == 200:  # extra metadata is echoed back exactly, big integers included
        assert response.json()["items"][0]["metadata"] == metadata
    else:
        assert_error(response, response.status_code, response.json()["error"]["code"])


def test_precomputed_control_is_accepted(qwen_server: LiveServer) -> None:
    """The well-formed item the hostile cases above are mutations of."""
    with qwen_server.client() as client:
        response = post_encode(client, _pre(_with()), _pre(_with(data=ROWS.tolist())))
    assert response.status_code == 200, response.text
    for item in response.json()["items"]:
        assert item["source"] == "precomputed" and item["metadata"] == {"image_grid_thw": GRID}
        torch.testing.assert_close(rows_of(item), ROWS)


# ---------------------------------------------------------------- 4. limits

MAX_ITEMS = 2
MAX_IMAGE_BYTES = 20_000
MAX_IMAGE_PIXELS = 1_000_000
MAX_BODY_BYTES = 100_000


@pytest.fixture(scope="module")
def limited_server(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(
        model=checkpoints["qwen2_vl"],
        served_model_name="limited",
        max_items_per_request=MAX_ITEMS,
        max_image_bytes=MAX_IMAGE_BYTES,
        max_image_pixels=MAX_IMAGE_PIXELS,
        max_body_bytes=MAX_BODY_BYTES,
        cache_dir=tmp_path_factory.mktemp("limited-cache"),
    ) as server:
        yield server


SMALL = save(noise_image(40, 30, seed=20), "PNG")  # well under every limit
BIG_BYTES = save(noise_image(100, 100, seed=21), "PNG")  # over max_image_bytes, under the body limit
PIXEL_BOMB = save(Image.new("L", (2000, 2000), 7), "PNG")  # 4 MP, a few KB
assert len(SMALL) < MAX_IMAGE_BYTES < len(BIG_BYTES) < MAX_BODY_BYTES // 2
assert len(PIXEL_BOMB) < MAX_IMAGE_BYTES


def _embeddings(*inputs: str) -> dict[str, Any]:
    return {"model": "limited", "input": list(inputs)}


def _files(*blobs: bytes) -> list[tuple[str, tuple[str, bytes, str]]]:
    return [("image", (f"{k}.png", blob, "image/png")) for k, blob in enumerate(blobs)]


@dataclass(frozen=True)
class Over:
    limit: str
    route: str
    json: dict[str, Any] | None = None
    files: list[tuple[str, tuple[str, bytes, str]]] | None = None
    index: int | None = None  # the item named, where one is


OVER_LIMITS: dict[str, Over] = {
    "items_encode_json": Over("max_items_per_request", "/v1/encode", {"items": [{"image": uri(SMALL)}] * 3}),
    "items_embeddings": Over("max_items_per_request", "/v1/embeddings", _embeddings(*[uri(SMALL)] * 3)),
    "items_precomputed": Over("max_items_per_request", "/v1/encode", {"items": [_pre(_with())] * 3}),
    "image_bytes_data_uri": Over(
        "max_image_bytes", "/v1/encode", {"items": [{"image": uri(SMALL)}, {"image": uri(BIG_BYTES)}]}, index=1
    ),
    "image_bytes_bare_base64": Over("max_image_bytes", "/v1/encode", {"items": [{"image": b64(BIG_BYTES)}]}, index=0),
    "image_bytes_embeddings": Over("max_image_bytes", "/v1/embeddings", _embeddings(uri(BIG_BYTES)), index=0),
    "image_bytes_multipart": Over("max_image_bytes", "/v1/encode", files=_files(SMALL, BIG_BYTES), index=1),
    "image_pixels_data_uri": Over(
        "max_image_pixels", "/v1/encode", {"items": [{"image": uri(SMALL)}, {"image": uri(PIXEL_BOMB)}]}, index=1
    ),
    "image_pixels_embeddings": Over("max_image_pixels", "/v1/embeddings", _embeddings(uri(PIXEL_BOMB)), index=0),
    "image_pixels_multipart": Over("max_image_pixels", "/v1/encode", files=_files(PIXEL_BOMB), index=0),
    "image_pixels_header_only_bomb": Over(
        "max_image_pixels", "/v1/encode", {"items": [{"image": uri(set_png_size(SMALL, 60_000, 60_000))}]}, index=0
    ),
}


@pytest.mark.parametrize("case", list(OVER_LIMITS))
def test_limits_are_payload_too_large(limited_server: LiveServer, case: str) -> None:
    over = OVER_LIMITS[case]
    with limited_server.client() as client:
        response = client.post(over.route, json=over.json, files=over.files)
    error = assert_error(response, 413, "payload_too_large")
    assert error["details"]["limit"] == over.limit, error
    if over.index is not None:
        # The OpenAI route names the caller's own field.
        where = f"input[{over.index}]" if over.route == "/v1/embeddings" else f"items[{over.index}].image"
        assert error["details"]["index"] == over.index and error["param"] == where, error


def test_too_many_multipart_files_is_payload_too_large(limited_server: LiveServer) -> None:
    with limited_server.client() as client:
        response = client.post("/v1/encode", files=_files(SMALL, SMALL, SMALL))
    error = assert_error(response, 413, "payload_too_large")
    assert error["details"]["limit"] == "max_items_per_request"


def test_pixel_bomb_is_refused_on_the_default_limits(qwen_server: LiveServer) -> None:
    """10000x10000 single-colour pixels are ~100 kB of PNG; the header alone refuses them."""
    bomb = save(Image.new("L", (10_000, 10_000), 0), "PNG")
    assert len(bomb) < 200_000
    forged = set_png_size(SMALL, 20_000, 20_000)  # 400 MP: past Pillow's own guard as well
    with qwen_server.client() as client:
        for source in (uri(bomb), uri(forged)):
            error = assert_error(post_encode(client, {"image": source}), 413, "payload_too_large")
            assert error["details"]["limit"] == "max_image_pixels"
            assert error["details"]["pixels"] > error["details"]["max_pixels"] == 40_000_000


def _big_json(route: str) -> bytes:
    filler = "A" * (MAX_BODY_BYTES + 50_000)
    body = {"items": [{"image": filler}]} if route == "/v1/encode" else _embeddings(filler)
    return json.dumps(body).encode()


def _chunks(data: bytes, size: int = 16_384) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


@pytest.mark.parametrize("framing", ["content_length", "chunked"])
@pytest.mark.parametrize("route", ["/v1/encode", "/v1/embeddings"])
def test_body_over_the_limit(limited_server: LiveServer, route: str, framing: str) -> None:
    body = _big_json(route)
    headers = {"content-type": "application/json"}
    with limited_server.client() as client:
        if framing == "chunked":
            response = client.post(route, content=_chunks(body), headers=headers)
            assert "content-length" not in response.request.headers
        else:
            response = client.post(route, content=body, headers=headers)
            assert response.request.headers["content-length"] == str(len(body))
    error = assert_error(response, 413, "payload_too_large")
    assert error["details"]["limit"] == "max_body_bytes" and error["details"]["max_bytes"] == MAX_BODY_BYTES


@pytest.mark.parametrize("framing", ["content_length", "chunked"])
def test_multipart_body_over_the_limit(limited_server: LiveServer, framing: str) -> None:
    # Two files (within the item limit) of 60 kB each: over the 100 kB body limit.
    blob = np.random.default_rng(22).integers(0, 256, 60_000, dtype=np.uint8).tobytes()
    request = httpx.Request("POST", limited_server.url + "/v1/encode", files=_files(blob, blob))
    body = request.read()
    headers = {"content-type": request.headers["content-type"]}
    content: bytes | Iterator[bytes] = _chunks(body) if framing == "chunked" else body
    with limited_server.client() as client:
        response = client.post("/v1/encode", content=content, headers=headers)
    error = assert_error(response, 413, "payload_too_large")
    assert error["details"]["limit"] == "max_body_bytes"


def test_within_limits_is_served(limited_server: LiveServer) -> None:
    with limited_server.client() as client:
        encode = post_encode(client, {"image": uri(SMALL)}, {"image": uri(SMALL)})
        upload = client.post("/v1/encode", files=_files(SMALL, SMALL))
        openai = client.post("/v1/embeddings", json=_embeddings(uri(SMALL), uri(SMALL)))
    for response in (encode, upload, openai):
        assert response.status_code == 200, response.text
    assert torch.equal(rows_of(encode.json()["items"][0]), rows_of(upload.json()["items"][1]))


# ---------------------------------------------------------------- 5. and then it still serves


def test_after_the_corpus_good_requests_are_served_correctly(
    qwen_server: LiveServer, limited_server: LiveServer, checkpoints: dict[str, Path], internal_errors_before: float
) -> None:
    adapter = load_encoder(checkpoints["qwen2_vl"], device=torch.device("cpu"), dtype=torch.float32)
    fresh = noise_image(42, 30, seed=2024)  # never sent before (the encoder must run), under every limit
    direct = adapter.forward([adapter.preprocess(fresh)]).rows
    for server in (qwen_server, limited_server):
        with server.client() as client:
            assert client.get("/ready").status_code == 200
            first = post_encode(client, {"image": uri(image_bytes(fresh))})
            again = post_encode(client, {"image": uri(image_bytes(fresh))})
        assert first.status_code == 200 and again.status_code == 200, (first.text, again.text)
        item, repeat = first.json()["items"][0], again.json()["items"][0]
        assert item["source"] == "encoder" and repeat["source"] == "cache"
        torch.testing.assert_close(rows_of(item), direct, atol=1e-5, rtol=0)
        assert torch.equal(rows_of(repeat), rows_of(item))
    # Nothing in this corpus was answered with a 500 by the main server.
    assert internal_errors(qwen_server) == internal_errors_before
