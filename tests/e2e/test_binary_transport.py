"""``/v1/encode`` answers as safetensors, negotiated by ``encoding_format`` or ``Accept``; kept payloads on hits.

The binary answer is read with the safetensors library only (``safetensors.torch.load`` for the
tensors, ``safe_open`` for the header), and checked bit for bit against the JSON answer's rows.
"""

from __future__ import annotations

import base64
import itertools
import sys
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import safetensors
import safetensors.torch
import torch

from mmencode.app.engine.cache import LRUEmbeddingCache, ResponseMemo
from mmencode.app.wire.encodings import embedding_payload
from mmencode.schemas.encode import EncodeResponse
from tests.helpers import LiveServer, assert_error, data_uri, image_bytes, noise_image, rows_of

SAFETENSORS = "application/vnd.safetensors"
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_seeds = itertools.count(1000)


def _fresh_image() -> str:
    """An image this server has not seen: its first request is a miss."""
    seed = next(_seeds)
    return data_uri(noise_image(56 + 4 * (seed % 8), 84, seed=seed))


def _rows_in_dtype(item: dict[str, Any]) -> torch.Tensor:
    """A base64 JSON item's rows in the dtype they were sent in."""
    embedding = item["embedding"]
    raw = bytearray(base64.b64decode(embedding["data"]))
    return torch.frombuffer(raw, dtype=DTYPES[embedding["dtype"]]).reshape(embedding["shape"])


def _load(response: httpx.Response, tmp_path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Tensors and the header's JSON answer, both read by the safetensors library."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == SAFETENSORS
    tensors = safetensors.torch.load(response.content)
    path = tmp_path / "answer.safetensors"
    path.write_bytes(response.content)
    with safetensors.safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata()
        assert sorted(handle.keys()) == sorted(tensors)
    assert set(metadata) == {"response"}
    return tensors, orjson.loads(metadata["response"])


def _without_payloads(answer: dict[str, Any]) -> dict[str, Any]:
    """The answer minus what differs by design between two requests: id, and the embedding's data/format."""
    out = {key: value for key, value in answer.items() if key != "id"}
    out["items"] = [
        {**item, "embedding": {k: v for k, v in item["embedding"].items() if k not in ("data", "encoding_format")}}
        for item in answer["items"]
    ]
    return out


@pytest.mark.parametrize("count", [1, 3])
@pytest.mark.parametrize("pooling", ["none", "mean"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_safetensors_answer_holds_exactly_the_json_rows(
    qwen_server: LiveServer, tmp_path: Path, dtype: str, pooling: str, count: int
) -> None:
    images = [_fresh_image() for _ in range(count)]
    if count > 1:
        images[-1] = images[0]  # the same content twice in one request: one tensor each
    body = {"items": [{"image": image} for image in images], "dtype": dtype, "pooling": pooling}
    with qwen_server.client() as client:
        as_json = client.post("/v1/encode", json=body)
        binary = client.post("/v1/encode", json={**body, "encoding_format": "safetensors"})
    assert as_json.status_code == 200, as_json.text
    answer = as_json.json()
    tensors, header = _load(binary, tmp_path)
    EncodeResponse.model_validate(header)
    assert sorted(tensors) == [f"items.{i}" for i in range(count)]
    for item, header_item in zip(answer["items"], header["items"], strict=True):
        name = header_item["embedding"]["data"]
        assert name == f"items.{item['index']}"
        assert header_item["embedding"]["encoding_format"] == "safetensors"
        tensor = tensors[name]
        assert tensor.dtype == DTYPES[dtype]
        assert torch.equal(tensor, _rows_in_dtype(item))
        assert list(tensor.shape) == item["embedding"]["shape"] == header_item["embedding"]["shape"]
    assert header["id"].startswith("enc-") and header["id"] != answer["id"]
    assert header["id"] == "enc-" + binary.headers["x-request-id"]
    # Everything else of the JSON answer is in the header, the same (the second request hit the cache).
    expected = _without_payloads(answer)
    for item in expected["items"]:
        item["source"] = "cache"
    expected["usage"].update(encoded_items=0, cached_items=count)
    assert _without_payloads(header) == expected


def _post(client: httpx.Client, image: str, accept: str | None = None, **options: str) -> httpx.Response:
    headers = {"accept": accept} if accept is not None else {}
    return client.post("/v1/encode", json={"items": [{"image": image}], **options}, headers=headers)


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, "application/json"),
        ("application/json", "application/json"),
        ("*/*", "application/json"),
        ("application/*", "application/json"),
        ("text/html", "application/json"),  # nothing offered matches: the header is disregarded
        (SAFETENSORS, SAFETENSORS),
        ("application/octet-stream", "application/octet-stream"),
        (f"{SAFETENSORS}, */*", SAFETENSORS),  # an exact match beats a wildcard of the same q
        (f"application/json;q=0.5, {SAFETENSORS}", SAFETENSORS),
        (f"application/json, {SAFETENSORS};q=0.9", "application/json"),
        (f"{SAFETENSORS};q=0, */*", "application/json"),
        (f"application/json;q=0, {SAFETENSORS};q=0.1", SAFETENSORS),
        (f"{SAFETENSORS};q=bogus, application/json;q=0.2", "application/json"),
    ],
)
def test_accept_header_chooses_the_format(qwen_server: LiveServer, accept: str | None, expected: str) -> None:
    with qwen_server.client() as client:
        response = _post(client, data_uri(noise_image(28, 28, seed=5)), accept)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == expected
    assert response.headers["vary"] == "Accept"
    if expected == "application/json":
        EncodeResponse.model_validate(response.json())
    else:
        assert list(safetensors.torch.load(response.content)) == ["items.0"]


def test_explicit_encoding_format_wins_over_accept_and_errors_stay_json(qwen_server: LiveServer) -> None:
    image = data_uri(noise_image(28, 28, seed=6))
    with qwen_server.client() as client:
        as_json = _post(client, image, SAFETENSORS, encoding_format="base64")
        binary = _post(client, image, "application/json", encoding_format="safetensors")
        upload = client.post(
            "/v1/encode",
            files=[("image", ("a.png", image_bytes(noise_image(28, 28, seed=6)), "image/png"))],
            data={"encoding_format": "safetensors", "dtype": "bfloat16"},
        )
        bad_image = _post(client, "not-base64!", SAFETENSORS)
        bad_schema = client.post("/v1/encode", json={"items": []}, headers={"accept": SAFETENSORS})
    assert as_json.headers["content-type"] == "application/json"
    assert binary.headers["content-type"] == SAFETENSORS
    from_upload = safetensors.torch.load(upload.content)["items.0"]
    assert from_upload.dtype == torch.bfloat16
    assert torch.equal(from_upload.float(), rows_of(as_json.json()["items"][0]).bfloat16().float())
    assert_error(bad_image, 400, "invalid_image")
    assert_error(bad_schema, 422, "validation_error")


def test_openapi_documents_the_binary_answer(qwen_server: LiveServer) -> None:
    with qwen_server.client() as client:
        operation = client.get("/openapi.json").json()["paths"]["/v1/encode"]["post"]
    content = operation["responses"]["200"]["content"]
    assert set(content) == {"application/json", SAFETENSORS, "application/octet-stream"}
    assert content[SAFETENSORS]["schema"] == {"type": "string", "format": "binary"}
    assert "items[<index>].precomputed_embedding" in operation["description"]


VARIANTS = [
    (fmt, dtype, pooling)
    for fmt in ("base64", "float", "pt", "npy", "safetensors")
    for dtype in ("float32", "float16", "bfloat16")
    for pooling in ("none", "mean")
    if not (fmt == "npy" and dtype == "bfloat16")
]


def _payload(response: httpx.Response, fmt: str) -> bytes:
    """The item's payload as it travelled: JSON text of `data`, or the tensor's bytes."""
    assert response.status_code == 200, response.text
    if fmt == "safetensors":
        return bytes(safetensors.torch.load(response.content)["items.0"].view(torch.uint8).flatten().numpy())
    return orjson.dumps(response.json()["items"][0]["embedding"]["data"])


def test_hits_answer_the_same_bytes_as_the_miss_in_every_variant(qwen_server: LiveServer) -> None:
    """Every variant of one image, twice: each hit is byte-identical to the first answer in that variant,
    and each is what encoding the rows afresh gives: no kept payload of another variant ever answers."""
    image = _fresh_image()
    with qwen_server.client() as client:
        reference = _post(client, image, encoding_format="base64")
        assert reference.json()["items"][0]["source"] == "encoder"
        rows = rows_of(reference.json()["items"][0])
        for fmt, dtype, pooling in VARIANTS:
            first = _post(client, image, encoding_format=fmt, dtype=dtype, pooling=pooling)
            again = _post(client, image, encoding_format=fmt, dtype=dtype, pooling=pooling)
            payload = _payload(first, fmt)
            assert _payload(again, fmt) == payload, (fmt, dtype, pooling)
            pooled = rows.mean(dim=0, keepdim=True) if pooling == "mean" else rows
            if fmt == "safetensors":
                fresh = pooled.to(DTYPES[dtype]).contiguous().view(torch.uint8).flatten().numpy().tobytes()
            else:
                data = embedding_payload(pooled, encoding_format=fmt, dtype=dtype)["data"]
                fresh = orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY)
            assert payload == fresh, (fmt, dtype, pooling)


def _gauge(client: httpx.Client, name: str) -> float:
    line = next(line for line in client.get("/metrics").text.splitlines() if line.startswith(name + " "))
    return float(line.split()[1])


def test_the_first_answer_of_a_miss_keeps_its_payload_for_repeats(qwen_server: LiveServer) -> None:
    image = _fresh_image()
    gauges = ("mmencode_cache_bytes", "mmencode_response_memo_bytes")
    with qwen_server.client() as client:
        before = [_gauge(client, name) for name in gauges]
        miss = _post(client, image, encoding_format="base64", dtype="float16")
        after_miss = [_gauge(client, name) for name in gauges]
        hit = _post(client, image, encoding_format="base64", dtype="float16")
        after_hit = [_gauge(client, name) for name in gauges]
    assert [r.json()["items"][0]["source"] for r in (miss, hit)] == ["encoder", "cache"]
    embedding = miss.json()["items"][0]["embedding"]
    assert hit.json()["items"][0]["embedding"] == embedding
    rows, width = embedding["shape"]
    # The cache holds the float32 rows; the memo the JSON text of `data` written for the first answer.
    assert after_miss[0] - before[0] == rows * width * 4 + LRUEmbeddingCache.ENTRY_OVERHEAD
    # The text with its bytes object's header, and the entry's bookkeeping.
    assert after_miss[1] - before[1] == sys.getsizeof(orjson.dumps(embedding["data"])) + ResponseMemo.ENTRY_OVERHEAD
    # The hit is answered from both and adds nothing.
    assert after_hit == after_miss
