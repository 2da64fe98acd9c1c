"""Image sources: the strict one-pass base64 decode (and its retry for line breaks), EXIF orientation."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image, ImageOps

from mmencode.app.engine.errors import InvalidImage, PayloadTooLarge
from mmencode.app.media.image import decode_base64_image, decode_image
from tests.helpers import noise_image

RAW = bytes(range(256)) * 40


def test_whitespace_anywhere_is_not_data() -> None:
    encoded = base64.b64encode(RAW).decode()
    spaced = "\r\n ".join(encoded[i : i + 60] for i in range(0, len(encoded), 60)) + "\n"
    assert decode_base64_image("data:image/png;base64," + spaced, max_bytes=len(RAW)) == RAW


def test_line_breaks_do_not_count_against_the_size_limit() -> None:
    encoded = base64.b64encode(RAW).decode()
    padded = "\n".join(encoded[i : i + 4] for i in range(0, len(encoded), 4))  # 25% longer than the data
    assert decode_base64_image(padded, max_bytes=len(RAW)) == RAW
    with pytest.raises(PayloadTooLarge):
        decode_base64_image(padded, max_bytes=len(RAW) - 1)


@pytest.mark.parametrize(
    "source",
    ["aGVsbG8", "aGVs bG8", "aGVsbG8é", "aGVs*bG8=", "=aGVsbG8=", "aGVsbG8=aGVs", "data:image/png;base64,aGVsbG8=="],
)
def test_malformed_base64_is_an_invalid_image(source: str) -> None:
    with pytest.raises(InvalidImage, match="not valid base64"):
        decode_base64_image(source, max_bytes=1000)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_is_applied_as_pillow_applies_it(orientation: int) -> None:
    exif = Image.Exif()
    exif[0x0112] = orientation
    buffer = io.BytesIO()
    noise_image(40, 24, seed=orientation).save(buffer, "PNG", exif=exif)
    reference = ImageOps.exif_transpose(Image.open(io.BytesIO(buffer.getvalue()))).convert("RGB")
    decoded = decode_image(buffer.getvalue(), max_pixels=10_000)
    assert decoded.size == reference.size == ((40, 24) if orientation < 5 else (24, 40))
    assert np.array_equal(np.asarray(decoded), np.asarray(reference))
