"""Multipart ``request`` part with binary item parts: the same answers and the same errors as JSON."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import pytest
import safetensors.torch
import torch

from tests.helpers import LiveServer, assert_error, data_uri, image_bytes, noise_image, precomputed, rows_of

IMAGE = noise_image(72, 60, seed=31)
GRID = {"image_grid_thw": [1, 6, 8]}  # 12 rows of width 64 on the tiny Qwen2-VL


def _raw(rows: torch.Tensor, dtype: str = "<f4") -> bytes:
    return rows.numpy().astype(dtype).tobytes()


def _multipart(
    client: httpx.Client, request: dict[str, Any], parts: dict[str, bytes], as_file: bool = False
) -> httpx.Response:
    files: list[tuple[str, Any]] = [(name, (name, data, "application/octet-stream")) for name, data in parts.items()]
    text = json.dumps(request)
    if as_file:
        files.insert(0, ("request", ("request.json", text.encode(), "application/json")))
        return client.post("/v1/encode", files=files)
    return client.post("/v1/encode", data={"request": text}, files=files)


def _same_answer(a: httpx.Response, b: httpx.Response) -> None:
    assert a.status_code == b.status_code == 200, (a.text, b.text)
    first, second = a.json(), b.json()
    assert first.pop("id") != second.pop("id")
    assert first == second


def test_binary_precomputed_parts_answer_as_base64_json(qwen_server: LiveServer) -> None:
    rows = torch.randn(12, 64, generator=torch.Generator().manual_seed(3))
    half = rows.half()
    with qwen_server.client() as client:
        as_json = client.post(
            "/v1/encode",
            json={
                "items": [
                    {"precomputed_embedding": precomputed(rows), "metadata": GRID},
                    {
                        "precomputed_embedding": {
                            "data": base64.b64encode(_raw(half.float(), "<f2")).decode(),
                            "dtype": "float16",
                            "shape": [12, 64],
                        },
                        "metadata": GRID,
                    },
                ]
            },
        )
        request = {
            "items": [
                {"precomputed_embedding": {"dtype": "float32", "shape": [12, 64]}, "metadata": GRID},
                {"precomputed_embedding": {"dtype": "float16", "shape": [12, 64]}, "metadata": GRID},
            ]
        }
        parts = {
            "items[0].precomputed_embedding": _raw(rows),
            "items[1].precomputed_embedding": _raw(half.float(), "<f2"),
        }
        as_field = _multipart(client, request, parts)
        as_file = _multipart(client, request, parts, as_file=True)
    _same_answer(as_json, as_field)
    _same_answer(as_field, as_file)
    assert torch.equal(rows_of(as_field.json()["items"][0]), rows)
    assert torch.equal(rows_of(as_field.json()["items"][1]), half.float())
    assert [item["source"] for item in as_field.json()["items"]] == ["precomputed", "precomputed"]


def test_binary_precomputed_equals_the_same_rows_as_base64(qwen_server: LiveServer) -> None:
    rows = torch.randn(12, 64, generator=torch.Generator().manual_seed(4))
    options = {"dtype": "bfloat16", "encoding_format": "base64"}
    with qwen_server.client() as client:
        as_json = client.post(
            "/v1/encode", json={"items": [{"precomputed_embedding": precomputed(rows), "metadata": GRID}], **options}
        )
        request = {
            "items": [{"precomputed_embedding": {"dtype": "float32", "shape": [12, 64]}, "metadata": GRID}],
            **options,
        }
        binary = _multipart(client, request, {"items[0].precomputed_embedding": _raw(rows)})
    _same_answer(as_json, binary)


def test_image_file_parts_answer_as_data_uris(qwen_server: LiveServer) -> None:
    other = noise_image(40, 52, seed=32)
    with qwen_server.client() as client:
        as_json = client.post("/v1/encode", json={"items": [{"image": data_uri(IMAGE)}, {"image": data_uri(other)}]})
        mixed = _multipart(
            client,
            {"items": [{}, {"image": data_uri(other)}]},
            {"items[0].image": image_bytes(IMAGE)},
        )
    assert mixed.status_code == 200, mixed.text
    for a, b in zip(as_json.json()["items"], mixed.json()["items"], strict=True):
        assert a["hash"] == b["hash"] and a["metadata"] == b["metadata"]
        assert torch.equal(rows_of(a), rows_of(b))


def _error_fields(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    error = assert_error(response, status, code)
    return {"param": error["param"], "details": error["details"], "message": error["message"]}


def test_bad_parts_give_the_json_errors(qwen_server: LiveServer) -> None:
    rows = torch.randn(12, 64)
    short = rows[:11]
    nan = rows.clone()
    nan[3, 5] = float("nan")
    spec = {"dtype": "float32", "shape": [12, 64]}
    with qwen_server.client() as client:

        def both(raw_rows: torch.Tensor) -> tuple[httpx.Response, httpx.Response]:
            as_json = client.post(
                "/v1/encode",
                json={"items": [{"precomputed_embedding": {**precomputed(raw_rows), **spec}, "metadata": GRID}]},
            )
            binary = _multipart(
                client,
                {"items": [{"precomputed_embedding": spec, "metadata": GRID}]},
                {"items[0].precomputed_embedding": _raw(raw_rows)},
            )
            return as_json, binary

        wrong_count = both(short)
        with_nan = both(nan)
        unknown = _multipart(
            client,
            {"items": [{"precomputed_embedding": spec, "metadata": GRID}]},
            {"items[0].precomputed_embedding": _raw(rows), "items[0].surprise": b"x", "extra": b"y"},
        )
        out_of_range = _multipart(
            client,
            {"items": [{"precomputed_embedding": spec, "metadata": GRID}]},
            {"items[0].precomputed_embedding": _raw(rows), "items[1].precomputed_embedding": _raw(rows)},
        )
        twice = _multipart(
            client,
            {"items": [{"precomputed_embedding": {**precomputed(rows), **spec}, "metadata": GRID}]},
            {"items[0].precomputed_embedding": _raw(rows)},
        )
        no_shape = _multipart(client, {"items": [{"metadata": GRID}]}, {"items[0].precomputed_embedding": _raw(rows)})
        not_json = client.post("/v1/encode", data={"request": "{nope"}, files={"x": ("x", b"", "text/plain")})
    assert _error_fields(wrong_count[0], 400, "precomputed_shape_mismatch") == _error_fields(
        wrong_count[1], 400, "precomputed_shape_mismatch"
    )
    assert wrong_count[1].json()["error"]["param"] == "items[0].precomputed_embedding.data"
    assert _error_fields(with_nan[0], 422, "validation_error") == _error_fields(with_nan[1], 422, "validation_error")
    assert with_nan[1].json()["error"]["param"] == "items[0].precomputed_embedding.data"
    assert "row 3, column 5" in with_nan[1].json()["error"]["message"]
    locs = [e["loc"] for e in assert_error(unknown, 422, "validation_error")["details"]["errors"]]
    assert locs == [["items[0].surprise"], ["extra"]]
    error = assert_error(out_of_range, 422, "validation_error")
    assert error["param"] == "items[1].precomputed_embedding"
    assert assert_error(twice, 422, "validation_error")["param"] == "items[0].precomputed_embedding.data"
    assert assert_error(no_shape, 422, "validation_error")["param"] == "items[0].precomputed_embedding.shape"
    assert assert_error(not_json, 422, "validation_error")["param"] == "request"


def test_limits_hold_as_for_json(qwen_server: LiveServer) -> None:
    settings = qwen_server.settings
    huge_grid = {"image_grid_thw": [1, 2048, 2048]}  # a million rows: past max_body_bytes as float32
    spec = {"dtype": "float32", "shape": [2048 * 2048 // 4, 64]}
    too_many = settings.max_items_per_request + 1
    with qwen_server.client() as client:
        big_json = client.post(
            "/v1/encode",
            json={"items": [{"precomputed_embedding": {**spec, "data": "AAAA"}, "metadata": huge_grid}]},
        )
        big_binary = _multipart(
            client,
            {"items": [{"precomputed_embedding": spec, "metadata": huge_grid}]},
            {"items[0].precomputed_embedding": b"\0" * 16},
        )
        many_json = client.post("/v1/encode", json={"items": [{"image": data_uri(IMAGE)}] * too_many})
        many_binary = _multipart(
            client,
            {"items": [{} for _ in range(too_many)]},
            {f"items[{i}].image": image_bytes(IMAGE) for i in range(too_many)},
        )
    assert _error_fields(big_json, 413, "payload_too_large") == _error_fields(big_binary, 413, "payload_too_large")
    assert big_binary.json()["error"]["details"]["limit"] == "max_body_bytes"
    assert _error_fields(many_json, 413, "payload_too_large") == _error_fields(many_binary, 413, "payload_too_large")
    assert many_binary.json()["error"]["details"]["limit"] == "max_items_per_request"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_binary_upload_binary_answer(qwen_server: LiveServer, dtype: str) -> None:
    """No base64 either way: raw bytes up, a safetensors container down."""
    rows = torch.randn(12, 64).to(torch.bfloat16 if dtype == "bfloat16" else torch.float32)
    raw = rows.view(torch.int16).numpy().astype("<i2").tobytes() if dtype == "bfloat16" else _raw(rows)
    with qwen_server.client() as client:
        response = _multipart(
            client,
            {
                "items": [{"precomputed_embedding": {"dtype": dtype, "shape": [12, 64]}, "metadata": GRID}],
                "encoding_format": "safetensors",
                "dtype": dtype,
            },
            {"items[0].precomputed_embedding": raw},
        )
    assert response.status_code == 200, response.text
    assert torch.equal(safetensors.torch.load(response.content)["items.0"], rows)
