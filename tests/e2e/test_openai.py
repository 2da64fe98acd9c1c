"""The official ``openai`` package, unchanged, against the live server."""

from __future__ import annotations

import base64

import numpy as np
import openai
import pytest
import torch

from tests.helpers import LiveServer, data_uri, noise_image, rows_of

IMAGES = [noise_image(120, 90, seed=31), noise_image(70, 150, seed=32)]


@pytest.fixture
def client(qwen_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=qwen_server.url + "/v1", api_key="unused", max_retries=0)


def _expected(qwen_server: LiveServer) -> tuple[list[torch.Tensor], list[int]]:
    with qwen_server.client() as http:
        items = http.post("/v1/encode", json={"items": [{"image": data_uri(i)} for i in IMAGES]}).json()["items"]
    vectors = [torch.nn.functional.normalize(rows_of(item).mean(0), dim=0) for item in items]
    return vectors, [item["num_tokens"] for item in items]


@pytest.mark.parametrize("encoding_format", [None, "float", "base64"])
def test_embeddings_equal_normalised_mean_of_encode_rows(
    client: openai.OpenAI, qwen_server: LiveServer, encoding_format: str | None
) -> None:
    expected, tokens = _expected(qwen_server)
    kwargs = {} if encoding_format is None else {"encoding_format": encoding_format}
    result = client.embeddings.create(model="tiny-qwen2-vl", input=[data_uri(i) for i in IMAGES], **kwargs)  # type: ignore[arg-type]
    assert result.model == "tiny-qwen2-vl"
    assert [d.index for d in result.data] == [0, 1]
    for data, want in zip(result.data, expected, strict=True):
        if isinstance(data.embedding, str):  # asked for base64 explicitly: the client hands it over as is
            got = torch.from_numpy(np.frombuffer(base64.b64decode(data.embedding), dtype="<f4").copy())
        else:  # default: the client asked for base64 and decoded it; or float
            got = torch.tensor(data.embedding)
        assert got.shape == (64,)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
        assert abs(float(got.norm()) - 1.0) < 1e-5
    assert result.usage.prompt_tokens == result.usage.total_tokens == sum(tokens)


def test_single_string_input_and_infinity_modality(qwen_server: LiveServer) -> None:
    with qwen_server.client() as http:
        response = http.post(
            "/v1/embeddings",
            json={"model": "tiny-qwen2-vl", "input": data_uri(IMAGES[0]), "modality": "image", "user": "u1"},
        )
    assert response.status_code == 200, response.text
    assert len(response.json()["data"]) == 1


def test_errors_raise_the_matching_openai_exceptions(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.embeddings.create(model="tiny-qwen2-vl", input=["data:image/png;base64,aGVsbG8="])
    assert bad.value.code == "invalid_image"
    assert bad.value.param == "input[0]"
    with pytest.raises(openai.NotFoundError) as missing:
        client.embeddings.create(model="text-embedding-3-small", input=[data_uri(IMAGES[0])])
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as dims:
        client.embeddings.create(model="tiny-qwen2-vl", input=[data_uri(IMAGES[0])], dimensions=16)
    assert dims.value.code == "unsupported_parameter"
    assert "64" in dims.value.message


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    assert [model.id for model in client.models.list()] == ["tiny-qwen2-vl"]
