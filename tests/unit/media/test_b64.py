"""The SIMD base64 codec keeps the standard library's rules: same bytes, same refusals, same messages."""

from __future__ import annotations

import base64
import binascii
import random

import pytest

from mmencode.app.media.b64 import decode_lenient_padding, decode_strict
from mmencode.app.wire.b64 import encode_ascii

ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _outcome(decode, text: str) -> bytes | str:
    try:
        return bytes(decode(text))
    except (binascii.Error, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"


def _strings(seed: int, count: int) -> list[str]:
    """Short strings of the alphabet, padding, whitespace and URL-safe characters: every corner case."""
    rng = random.Random(seed)
    noisy = ALPHABET + "====" + " \n-_é"
    return [
        "".join(rng.choice(noisy if rng.random() < 0.5 else ALPHABET + "=") for _ in range(rng.randint(0, 13)))
        for _ in range(count)
    ]


@pytest.mark.parametrize(
    ("ours", "stdlib"),
    [
        (decode_strict, lambda text: binascii.a2b_base64(text, strict_mode=True)),
        (decode_lenient_padding, lambda text: base64.b64decode(text, validate=True)),
    ],
    ids=["strict", "validate"],
)
def test_decoding_accepts_refuses_and_explains_exactly_as_the_standard_library(ours, stdlib) -> None:
    accepted = refused = 0
    for text in _strings(seed=7, count=40_000):
        expected = _outcome(stdlib, text)
        assert _outcome(ours, text) == expected, text
        accepted += isinstance(expected, bytes)
        refused += isinstance(expected, str)
    assert accepted > 1000 and refused > 1000  # both sides of the rules were exercised


def test_a_stray_pad_after_a_complete_group_is_read_as_the_standard_library_reads_it() -> None:
    # pybase64 refuses "QUFB=" where binascii's strict mode accepts it: the fallback keeps that behaviour.
    assert decode_strict("QUFB=") == binascii.a2b_base64("QUFB=", strict_mode=True) == b"AAA"


def test_large_payloads_round_trip_through_the_standard_library() -> None:
    payload = random.Random(3).randbytes(3_000_001)
    text = encode_ascii(payload)
    assert text == base64.b64encode(payload).decode("ascii")
    assert decode_strict(text) == payload
    assert decode_lenient_padding(text.encode()) == payload
    with pytest.raises(binascii.Error):
        decode_strict(text[:1000] + "\n" + text[1000:])  # line breaks are the caller's to strip
