"""Base64 images: the strict in-place decode agrees with the standard library's lenient reading."""

from __future__ import annotations

import base64
import binascii
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmencode.app.engine.errors import InvalidImage, PayloadTooLarge
from mmencode.app.media.image import decode_base64_image


def _reference(text: str) -> bytes:
    """What the service accepted before its fast path: whitespace stripped, then strict base64."""
    return base64.b64decode(re.sub(rb"\s+", b"", text.encode("ascii", errors="replace")), validate=True)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=300), wrap=st.sampled_from([0, 4, 76]), uri=st.booleans())
def test_canonical_and_wrapped_base64_decode_to_the_same_bytes(data: bytes, wrap: int, uri: bool) -> None:
    text = base64.b64encode(data).decode()
    if wrap:
        text = "\n".join(text[i : i + wrap] for i in range(0, len(text), wrap))
    source = f"data:image/png;base64,{text}" if uri else text
    assert decode_base64_image(source, max_bytes=10_000) == data


@settings(max_examples=500, deadline=None)
@given(text=st.text(alphabet="AB+/=\n \t-_.é", max_size=24))
def test_any_text_is_refused_or_decoded_exactly_as_the_reference_does(text: str) -> None:
    try:
        expected = _reference(text)
    except (binascii.Error, ValueError):
        with pytest.raises(InvalidImage):
            decode_base64_image(text, max_bytes=10_000)
    else:
        assert decode_base64_image(text, max_bytes=10_000) == expected


def test_size_limit_holds_on_the_fast_path() -> None:
    text = base64.b64encode(b"x" * 101).decode()
    with pytest.raises(PayloadTooLarge):
        decode_base64_image(text, max_bytes=100)
    assert decode_base64_image(text, max_bytes=101) == b"x" * 101
