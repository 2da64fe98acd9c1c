"""Small things users notice: a repeated image costs one encode; text sent for embedding is named as such."""

from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import LiveServer, assert_error, data_uri, noise_image, rows_of


def _images_encoded(server: LiveServer) -> float:
    """Images that went through an encoder forward so far (the sum of the per-batch histogram)."""
    for family in text_string_to_metric_families(httpx.get(server.url + "/metrics").text):
        for sample in family.samples:
            if sample.name == "mmencode_batch_items_sum":
                return float(sample.value)
    raise AssertionError("no mmencode_batch_items_sum")


def test_the_same_image_twice_in_one_request_is_encoded_once(qwen_server: LiveServer) -> None:
    cat, dog = data_uri(noise_image(84, 56, seed=9101)), data_uri(noise_image(56, 84, seed=9102))
    before = _images_encoded(qwen_server)
    response = httpx.post(
        qwen_server.url + "/v1/encode",
        json={"items": [{"image": cat}, {"image": dog}, {"image": cat}], "encoding_format": "float"},
    )
    assert response.status_code == 200, response.text
    assert _images_encoded(qwen_server) - before == 2

    items = response.json()["items"]
    assert [item["index"] for item in items] == [0, 1, 2]
    assert items[0]["hash"] == items[2]["hash"] != items[1]["hash"]
    assert items[0]["metadata"] == items[2]["metadata"]
    assert rows_of(items[0]).equal(rows_of(items[2]))
    assert response.json()["usage"]["items"] == 3


@pytest.mark.parametrize("text", ["a photo of a cat", "hello", "test"])
def test_text_sent_to_embeddings_is_told_that_only_images_are_accepted(qwen_server: LiveServer, text: str) -> None:
    inputs = [data_uri(noise_image(8, 8)), text]
    response = httpx.post(qwen_server.url + "/v1/embeddings", json={"model": "tiny-qwen2-vl", "input": inputs})
    error = assert_error(response, 400, "invalid_image")
    assert error["param"] == "input[1]"
    assert "images only, not text" in error["message"] and "base64 (" not in error["message"]


def test_the_openai_client_sees_the_same_message(qwen_server: LiveServer) -> None:
    client = openai.OpenAI(base_url=qwen_server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as raised:
        client.embeddings.create(model="tiny-qwen2-vl", input="The food was delicious")
    assert "images only, not text" in str(raised.value)
