"""Bodies parsed by jiter give exactly what the standard library gave: values, acceptance, errors."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from mmencode.app.http.json_body import JiterRequest

BODIES = [
    b'{"model": "m", "input": ["data:image/png;base64,iVBORw0KGgo="], "dimensions": null}',
    b'{"items": [{"metadata": {"f": 0.1, "g": 1e-310, "h": -0.0, "i": 12345678901234567, "s": "\\u00e9\\n\\""}}]}',
    '{"caf\u00e9": ["\u65e5\u672c", "\U0001f600"], "deep": [[[[[]]]]], "t": true, "n": null}'.encode(),
    b'{"dup": 1, "dup": 2}',
    b'{"big": 123456789012345678901234567890}',  # past 64 bits: an int (orjson made it a float)
    b'{"x": NaN, "y": -Infinity}',  # not JSON, yet json.loads reads it: accepted as before
    b'{"huge": 1e400}',
    b'{"lone": "\\ud800"}',  # a lone surrogate escape
    '{"utf16": "yes"}'.encode("utf-16"),  # json.loads detects UTF-16 and UTF-32
    b"[1, 2, 3]",
]
MALFORMED = [b"{", b'{"a": }', b'{"a": 1,}', b"\xff\xfe\x00", b'{"a": "\x01"}', b"nul", b"{} {}"]


def _parse(body: bytes) -> object:
    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": body, "more_body": False}

    return asyncio.run(JiterRequest({"type": "http", "method": "POST", "headers": []}, receive).json())


def _same(a: object, b: object) -> bool:
    # NaN != NaN: compare the JSON text each side writes back.
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@pytest.mark.parametrize("body", BODIES)
def test_every_body_parses_to_what_the_standard_library_reads(body: bytes) -> None:
    assert _same(_parse(body), json.loads(body))


def test_numbers_parse_to_the_same_floats_and_integers() -> None:
    rng = random.Random(5)
    numbers = [repr(rng.uniform(-1, 1) * 10 ** rng.randint(-320, 308)) for _ in range(3000)]
    numbers += [
        f"{rng.randint(0, 10 ** rng.randint(1, 25))}.{rng.randint(0, 10**17)}e{rng.randint(-330, 330)}"
        for _ in range(3000)
    ]
    numbers += [str(rng.randint(-(10**30), 10**30)) for _ in range(1000)]
    body = ("[" + ", ".join(numbers) + "]").encode()
    ours, theirs = _parse(body), json.loads(body)
    assert isinstance(ours, list) and len(ours) == len(theirs)
    mismatched = [(text, a, b) for text, a, b in zip(numbers, ours, theirs, strict=True) if repr(a) != repr(b)]
    assert mismatched == []


@pytest.mark.parametrize("body", MALFORMED)
def test_a_malformed_body_fails_with_the_standard_librarys_error(body: bytes) -> None:
    try:
        json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as expected:
        with pytest.raises(type(expected)) as got:
            _parse(body)
        assert str(got.value) == str(expected)
    else:  # pragma: no cover - the corpus is meant to be malformed
        pytest.fail(f"{body!r} parses")
