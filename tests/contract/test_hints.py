"""What a newcomer gets wrong, answered with what to do instead: every limit names its flag, a clip sent as
an image or as a bare form field says where it goes, a file sent as the raw body says how files are sent."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.helpers import asgi_client, assert_error, clip, data_uri, image_bytes, noise_image

MP4 = clip(4, 32, 32, fps=4, seed=1)
BIG_PNG = image_bytes(noise_image(60, 60, seed=3))  # ~10 KB, over the 3,000 bytes below
JPEG = image_bytes(noise_image(40, 30, seed=1), "JPEG")


@pytest.fixture(scope="module")
async def small(
    checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[httpx.AsyncClient]:
    """An app with small limits, each one reachable."""
    settings = {"max_body_bytes": 16_384, "max_items_per_request": 2, "max_image_bytes": 3_000}
    async with asgi_client(
        model=checkpoints["qwen2_vl"], cache_dir=tmp_path_factory.mktemp("cache"), **settings
    ) as client:
        yield client


@pytest.mark.parametrize(
    ("request_kwargs", "flag"),
    [
        ({"content": b"{" + b" " * 20_000 + b"}"}, "--max-body-bytes"),
        ({"json": {"items": [{"image": data_uri(noise_image(8, 8))}] * 3}}, "--max-items-per-request"),
        ({"json": {"items": [{"image": data_uri(noise_image(60, 60, seed=3))}]}}, "--max-image-bytes"),
        (
            {"files": [("image", ("big.png", image_bytes(noise_image(60, 60, seed=3)), "image/png"))]},
            "--max-image-bytes",
        ),
    ],
    ids=["body", "items", "inline-image", "uploaded-image"],
)
async def test_every_limit_names_its_flag(
    small: httpx.AsyncClient, request_kwargs: dict[str, object], flag: str
) -> None:
    response = await small.post("/v1/encode", **request_kwargs)  # type: ignore[arg-type]
    error = assert_error(response, 413, "payload_too_large")
    assert flag in error["message"], error


async def test_a_clip_uploaded_as_an_image_says_it_is_a_video(qwen_app: httpx.AsyncClient) -> None:
    response = await qwen_app.post("/v1/encode", files=[("image", ("clip.mp4", MP4, "video/mp4"))])
    error = assert_error(response, 400, "invalid_image")
    assert "looks like an MP4 (or MOV) video: send it as the item's `video`" in error["message"], error


async def test_a_video_form_field_points_at_the_item_part(qwen_app: httpx.AsyncClient) -> None:
    response = await qwen_app.post("/v1/encode", files=[("video", ("clip.mp4", MP4, "video/mp4"))])
    error = assert_error(response, 422, "validation_error")
    assert "items[0].video=@file" in error["message"], error


@pytest.mark.parametrize(("body", "hint"), [(JPEG, "-F image=@file"), (MP4, "items[0].video=@file")])
async def test_a_file_sent_as_the_raw_body_is_told_how_files_are_sent(
    qwen_app: httpx.AsyncClient, body: bytes, hint: str
) -> None:
    response = await qwen_app.post("/v1/encode", content=body, headers={"content-type": "application/octet-stream"})
    error = assert_error(response, 422, "validation_error")
    assert "not a JSON request: send files as multipart" in error["message"] and hint in error["message"], error


async def test_a_body_refused_from_its_length_is_counted_under_its_route(small: httpx.AsyncClient) -> None:
    response = await small.post("/v1/encode", content=b"{" + b" " * 20_000 + b"}")
    assert response.status_code == 413
    metrics = (await small.get("/metrics")).text
    assert 'mmencode_requests_total{method="POST",route="/v1/encode",status="413"}' in metrics
    assert 'route="unmatched",status="413"' not in metrics
