"""Each error message names its fix: the flag to change, the field meant, what the service takes.

Contract tests over ASGI (``qwen_app``): the error shapes need no socket."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import pytest

from mmencode.app.engine.errors import PayloadTooLarge
from mmencode.app.media.image import decode_image
from tests.helpers import assert_error, data_uri, image_bytes, noise_image


async def _encode(client: httpx.AsyncClient, body: dict[str, Any]) -> httpx.Response:
    return await client.post("/v1/encode", json=body)


async def test_a_private_url_names_the_flags_that_allow_it(qwen_app: httpx.AsyncClient) -> None:
    response = await _encode(qwen_app, {"items": [{"image": "http://127.0.0.1:9/cat.png"}]})
    error = assert_error(response, 400, "url_not_allowed")
    assert "--allowed-url-hosts 127.0.0.1" in error["message"] and "--allow-private-urls" in error["message"]
    assert error["details"] == {"index": 0, "host": "127.0.0.1", "addresses": ["127.0.0.1"]}  # as before


def test_the_pixel_limit_names_its_flag_in_the_message() -> None:
    with pytest.raises(PayloadTooLarge) as refused:
        decode_image(image_bytes(noise_image(56, 56)), max_pixels=1000)
    assert "over the limit of 1000" in refused.value.message
    assert "--max-image-pixels" in refused.value.message and "MMENCODE_MAX_IMAGE_PIXELS" in refused.value.message
    assert refused.value.details is not None and refused.value.details["limit"] == "max_image_pixels"


@pytest.mark.parametrize("text", ["a photo of a cat", "cat", "What is in this image?"])
async def test_text_sent_to_encode_is_told_the_service_encodes_images(qwen_app: httpx.AsyncClient, text: str) -> None:
    error = assert_error(await _encode(qwen_app, {"items": [{"image": text}]}), 400, "invalid_image")
    assert "this service encodes images only, not text" in error["message"]
    assert "data:image/png;base64" in error["message"]
    assert error["param"] == "items[0].image"


async def test_base64_of_a_non_image_keeps_the_decoders_message(qwen_app: httpx.AsyncClient) -> None:
    payload = base64.b64encode(b"%PDF-1.7 " + bytes(range(64))).decode()
    error = assert_error(await _encode(qwen_app, {"items": [{"image": payload}]}), 400, "invalid_image")
    assert "not a recognised image format" in error["message"]


@pytest.mark.parametrize(
    ("body", "misspelt", "meant"),
    [
        ({"items": [{"imgae": "x"}]}, "items[0].imgae", "image"),
        ({"items": [{"image": "x"}], "encodng_format": "float"}, "encodng_format", "encoding_format"),
        ({"items": [{"image": "x", "metdata": {}}]}, "items[0].metdata", "metadata"),
        (
            {"items": [{"precomputed_embedding": {"data": [[0.0]], "dtpye": "float32", "shape": [1, 1]}}]},
            "items[0].precomputed_embedding.dtpye",
            "dtype",
        ),
    ],
)
async def test_a_misspelt_field_gets_a_did_you_mean(
    qwen_app: httpx.AsyncClient, body: dict[str, Any], misspelt: str, meant: str
) -> None:
    error = assert_error(await _encode(qwen_app, body), 422, "validation_error")
    problems = {problem["msg"] for problem in error["details"]["errors"]}
    assert any(f"did you mean `{meant}`?" in msg for msg in problems), problems
    if error["param"] == misspelt:
        assert f"did you mean `{meant}`?" in error["message"]


async def test_a_misspelt_form_field_gets_a_did_you_mean(qwen_app: httpx.AsyncClient) -> None:
    files = {"image": ("cat.png", image_bytes(noise_image(56, 56)), "image/png")}
    response = await qwen_app.post("/v1/encode", files=files, data={"encodng_format": "float"})
    error = assert_error(response, 422, "validation_error")
    assert "did you mean `encoding_format`?" in error["message"]


async def test_an_item_with_both_hash_and_image_is_refused(qwen_app: httpx.AsyncClient) -> None:
    image = data_uri(noise_image(56, 56))
    first = await _encode(qwen_app, {"items": [{"image": image}]})
    assert first.status_code == 200
    item_hash = first.json()["items"][0]["hash"]
    both = await _encode(qwen_app, {"items": [{"image": image, "hash": item_hash}]})
    error = assert_error(both, 422, "validation_error")
    assert error["param"] == "items[0]"
    assert "`image` or `hash`, not both" in error["message"]
