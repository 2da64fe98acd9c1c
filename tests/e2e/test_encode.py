"""``POST /v1/encode`` against the real app under uvicorn on a loopback port, over httpx."""

from __future__ import annotations

import base64
from pathlib import Path

import torch

from mmencode.models import load_encoder
from mmencode.schemas.encode import EncodeResponse
from tests.helpers import LiveServer, assert_error, data_uri, image_bytes, noise_image, precomputed, rows_of

IMAGE_A = noise_image(120, 90, seed=11)
IMAGE_B = noise_image(64, 200, seed=12)


def _direct_rows(checkpoint: Path, image: object) -> torch.Tensor:
    adapter = load_encoder(checkpoint, device=torch.device("cpu"), dtype=torch.float32)
    prepared = adapter.preprocess(image)  # type: ignore[arg-type]
    return adapter.forward([prepared]).rows


def test_json_request_returns_rows_and_metadata(qwen_server: LiveServer, checkpoints: dict[str, Path]) -> None:
    with qwen_server.client() as client:
        response = client.post(
            "/v1/encode",
            json={"model": "tiny-qwen2-vl", "items": [{"image": data_uri(IMAGE_A)}, {"image": data_uri(IMAGE_B)}]},
        )
    assert response.status_code == 200, response.text
    body = EncodeResponse.model_validate(response.json()).model_dump()
    assert body["model"] == "tiny-qwen2-vl"
    for index, (item, image) in enumerate(zip(body["items"], [IMAGE_A, IMAGE_B], strict=True)):
        assert item["index"] == index
        t, h, w = item["metadata"]["image_grid_thw"]
        assert item["num_tokens"] == t * h * w // 4 == item["embedding"]["shape"][0]
        assert item["embedding"]["shape"][1] == 64
        assert len(item["hash"]) == 32
        torch.testing.assert_close(rows_of(item), _direct_rows(checkpoints["qwen2_vl"], image), atol=1e-5, rtol=0)
    assert body["usage"]["items"] == 2
    assert body["usage"]["tokens"] == sum(item["num_tokens"] for item in body["items"])


def test_multipart_upload_like_curl(qwen_server: LiveServer) -> None:
    files = [
        ("image", ("a.png", image_bytes(IMAGE_A), "image/png")),
        ("image", ("b.jpg", image_bytes(IMAGE_B, "JPEG"), "image/jpeg")),
    ]
    with qwen_server.client() as client:
        response = client.post("/v1/encode", files=files, data={"encoding_format": "float", "dtype": "bfloat16"})
        json_a = client.post("/v1/encode", json={"items": [{"image": data_uri(IMAGE_A)}]}).json()
    assert response.status_code == 200, response.text
    items = response.json()["items"]
    assert [item["index"] for item in items] == [0, 1]
    assert items[0]["embedding"]["dtype"] == "bfloat16"
    # Same bytes as the PNG in the JSON request: same content hash, same rows (within bfloat16).
    assert items[0]["hash"] == json_a["items"][0]["hash"]
    torch.testing.assert_close(rows_of(items[0]), rows_of(json_a["items"][0]), atol=1e-2, rtol=1e-2)


def test_encoding_formats_and_dtypes_agree(qwen_server: LiveServer) -> None:
    item = {"image": data_uri(IMAGE_A)}
    with qwen_server.client() as client:
        outputs = {
            (fmt, dtype): client.post(
                "/v1/encode", json={"items": [item], "encoding_format": fmt, "dtype": dtype}
            ).json()["items"][0]
            for fmt in ("base64", "float")
            for dtype in ("float32", "float16", "bfloat16")
        }
        pooled = client.post("/v1/encode", json={"items": [item], "pooling": "mean"}).json()["items"][0]
    reference = rows_of(outputs[("base64", "float32")])
    for (fmt, dtype), out in outputs.items():
        assert out["embedding"]["encoding_format"] == fmt and out["embedding"]["dtype"] == dtype
        tolerance = 1e-6 if dtype == "float32" else 1e-2
        torch.testing.assert_close(rows_of(out), reference, atol=tolerance, rtol=tolerance)
    assert pooled["embedding"]["shape"] == [1, 64]
    assert pooled["num_tokens"] == reference.shape[0]
    torch.testing.assert_close(rows_of(pooled)[0], reference.mean(0), atol=1e-6, rtol=0)


def test_hash_reuses_the_cached_embedding(qwen_server: LiveServer) -> None:
    with qwen_server.client() as client:
        first = client.post("/v1/encode", json={"items": [{"image": data_uri(IMAGE_B)}]}).json()["items"][0]
        again = client.post("/v1/encode", json={"items": [{"hash": first["hash"]}]})
    assert again.status_code == 200, again.text
    item = again.json()["items"][0]
    assert item["source"] == "cache" and item["hash"] == first["hash"]
    assert item["metadata"] == first["metadata"]
    assert torch.equal(rows_of(item), rows_of(first))
    assert again.json()["usage"]["cached_items"] == 1


def test_unknown_hash(qwen_server: LiveServer) -> None:
    with qwen_server.client() as client:
        response = client.post("/v1/encode", json={"items": [{"hash": "0" * 32}]})
    error = assert_error(response, 400, "unknown_hash")
    assert error["param"] == "items[0].hash"


def test_partial_precomputed_names_the_items_then_fill_encodes_them(qwen_server: LiveServer) -> None:
    with qwen_server.client() as client:
        encoded = client.post("/v1/encode", json={"items": [{"image": data_uri(IMAGE_A)}]}).json()["items"][0]
        given = {"precomputed_embedding": precomputed(rows_of(encoded)), "metadata": encoded["metadata"]}
        fresh = noise_image(80, 80, seed=21)  # not in the cache yet: the encoder must run
        items = [given, {"image": data_uri(fresh)}, given]
        strict = client.post("/v1/encode", json={"items": items})
        filled = client.post("/v1/encode", json={"items": items, "precomputed": "fill"})
    error = assert_error(strict, 400, "partial_precomputed")
    assert error["details"] == {"precomputed": [0, 2], "missing": [1]}
    assert error["param"] == "items[1].precomputed_embedding"
    assert filled.status_code == 200, filled.text
    body = filled.json()
    assert [item["source"] for item in body["items"]] == ["precomputed", "encoder", "precomputed"]
    assert [item["index"] for item in body["items"]] == [0, 1, 2]
    assert torch.equal(rows_of(body["items"][0]), rows_of(encoded))
    assert body["usage"]["precomputed_items"] == 2 and body["usage"]["encoded_items"] == 1


def test_all_precomputed_needs_no_encoder_and_checks_shapes(qwen_server: LiveServer) -> None:
    rows = torch.randn(12, 64)
    good = {"precomputed_embedding": precomputed(rows), "metadata": {"image_grid_thw": [1, 6, 8]}}
    wrong = {"precomputed_embedding": precomputed(torch.randn(11, 64)), "metadata": {"image_grid_thw": [1, 6, 8]}}
    with qwen_server.client() as client:
        ok = client.post("/v1/encode", json={"items": [good, good]})
        mismatch = client.post("/v1/encode", json={"items": [good, wrong]})
        no_grid = client.post("/v1/encode", json={"items": [{"precomputed_embedding": precomputed(rows)}]})
    assert ok.status_code == 200, ok.text
    assert torch.allclose(rows_of(ok.json()["items"][1]), rows)
    error = assert_error(mismatch, 400, "precomputed_shape_mismatch")
    assert error["details"]["items"] == [{"index": 1, "expected": [12, 64], "given": [11, 64]}]
    error = assert_error(no_grid, 400, "missing_metadata")
    assert error["details"]["items"][0] == {
        "index": 0,
        "field": "image_grid_thw",
        "reason": "is required for precomputed items of this model",
    }


def test_invalid_image_names_the_item(qwen_server: LiveServer) -> None:
    not_an_image = base64.b64encode(b"<html>hello</html>").decode()
    with qwen_server.client() as client:
        response = client.post("/v1/encode", json={"items": [{"image": data_uri(IMAGE_A)}, {"image": not_an_image}]})
    error = assert_error(response, 400, "invalid_image")
    assert error["param"] == "items[1].image"
    assert error["details"]["index"] == 1


def test_schema_violations_are_422_in_the_error_shape(qwen_server: LiveServer) -> None:
    with qwen_server.client() as client:
        cases = [
            client.post("/v1/encode", json={"items": []}),
            client.post("/v1/encode", json={"items": [{}]}),
            client.post("/v1/encode", json={"items": [{"image": "x"}], "dtype": "int8"}),
            client.post("/v1/encode", content=b"{not json", headers={"content-type": "application/json"}),
            client.post("/v1/encode", json={"items": [{"image": "x"}], "surprise": 1}),
        ]
    for response in cases:
        error = assert_error(response, 422, "validation_error")
        assert error["details"]["errors"], error
    assert assert_error(cases[2], 422, "validation_error")["param"] == "dtype"


def test_model_must_match(qwen_server: LiveServer) -> None:
    with qwen_server.client() as client:
        response = client.post("/v1/encode", json={"model": "gpt-4o", "items": [{"image": data_uri(IMAGE_A)}]})
    error = assert_error(response, 404, "model_not_found")
    assert error["details"]["available"] == ["tiny-qwen2-vl"]


def test_request_id_is_echoed_and_unknown_routes_use_the_error_shape(qwen_server: LiveServer) -> None:
    with qwen_server.client() as client:
        echoed = client.get("/health", headers={"X-Request-ID": "trace-123"})
        missing = client.get("/v2/nothing")
        wrong_method = client.get("/v1/encode")
    assert echoed.headers["x-request-id"] == "trace-123"
    assert_error(missing, 404, "not_found")
    assert_error(wrong_method, 405, "method_not_allowed")


def test_internvl_precomputed_needs_num_patches(internvl_server: LiveServer) -> None:
    with internvl_server.client() as client:
        encoded = client.post("/v1/encode", json={"items": [{"image": data_uri(IMAGE_B)}]}).json()["items"][0]
        rows = rows_of(encoded)
        without = client.post("/v1/encode", json={"items": [{"precomputed_embedding": precomputed(rows)}]})
        with_it = client.post(
            "/v1/encode",
            json={"items": [{"precomputed_embedding": precomputed(rows), "metadata": encoded["metadata"]}]},
        )
    assert encoded["num_tokens"] == encoded["metadata"]["num_patches"] * 16
    error = assert_error(without, 400, "missing_metadata")
    assert error["param"] == "items[0].metadata.num_patches"
    assert error["details"]["required"] == ["num_patches"]
    assert with_it.status_code == 200, with_it.text
