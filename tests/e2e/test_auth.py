"""API keys as operators and OpenAI clients meet them, on a live server."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from mmencode.app.config import Settings
from mmencode.app.http.auth import is_protected
from tests.helpers import LiveServer, assert_error, data_uri, live_server, noise_image

KEYS = ["key-one-7f3a9c", "key-two-51be02"]
FILE_KEY = "key-from-file-9d0e"


@pytest.fixture(scope="module")
def keyed_server(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    directory = tmp_path_factory.mktemp("keys")
    key_file = directory / "keys.txt"
    key_file.write_text(f"# one key per line\n\n{FILE_KEY}\n")
    with live_server(
        model=checkpoints["siglip"],
        served_model_name="tiny-siglip",
        cache_dir=directory / "cache",
        api_key=",".join(KEYS),
        api_key_file=key_file,
    ) as server:
        yield server


def _protected_routes(server: LiveServer) -> list[tuple[str, str]]:
    """Every /v1 operation the service documents, so a route added later is covered too."""
    spec = httpx.get(server.url + "/openapi.json").json()
    routes = [(method.upper(), path) for path, ops in spec["paths"].items() for method in ops if is_protected(path)]
    assert ("POST", "/v1/encode") in routes and ("GET", "/v1/models") in routes
    return routes


@pytest.mark.parametrize("header", [None, "Bearer wrong-key", "Basic a2V5LW9uZQ==", "Bearer", KEYS[0]])
def test_every_v1_route_refuses_a_missing_or_wrong_key(keyed_server: LiveServer, header: str | None) -> None:
    headers = {"authorization": header} if header is not None else {}
    for method, path in _protected_routes(keyed_server):
        response = httpx.request(method, keyed_server.url + path, headers=headers, json={"items": []})
        error = assert_error(response, 401, "invalid_api_key")
        assert error["type"] == "invalid_request_error"
        assert response.headers["www-authenticate"] == "Bearer"
        assert KEYS[0] not in response.text


@pytest.mark.parametrize("key", [*KEYS, FILE_KEY])
def test_each_configured_key_is_accepted(keyed_server: LiveServer, key: str) -> None:
    headers = {"authorization": f"Bearer {key}"}
    response = httpx.post(
        keyed_server.url + "/v1/encode", headers=headers, json={"items": [{"image": data_uri(noise_image(40, 40))}]}
    )
    assert response.status_code == 200, response.text
    assert httpx.get(keyed_server.url + "/v1/models", headers=headers).status_code == 200


def test_probes_and_metrics_stay_open(keyed_server: LiveServer) -> None:
    for path in ("/health", "/ready", "/metrics"):
        assert httpx.get(keyed_server.url + path).status_code == 200, path


def test_the_openai_client_raises_authentication_error_and_works_with_a_key(keyed_server: LiveServer) -> None:
    image = data_uri(noise_image(48, 32, seed=3))
    wrong = openai.OpenAI(base_url=keyed_server.url + "/v1", api_key="not-a-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as raised:
        wrong.embeddings.create(model="tiny-siglip", input=[image])
    assert raised.value.status_code == 401 and raised.value.code == "invalid_api_key"

    client = openai.OpenAI(base_url=keyed_server.url + "/v1", api_key=KEYS[1], max_retries=0)
    result = client.embeddings.create(model="tiny-siglip", input=[image])
    assert len(result.data) == 1 and len(result.data[0].embedding) == 32


def test_keys_never_reach_the_logs(keyed_server: LiveServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    for key in (KEYS[0], "a-guessed-key-0000"):
        httpx.post(keyed_server.url + "/v1/encode", headers={"authorization": f"Bearer {key}"}, json={"items": []})
    assert caplog.records, "the requests were logged"
    assert not any(key in record.getMessage() for record in caplog.records for key in (*KEYS, "a-guessed-key"))
    assert KEYS[0] not in repr(keyed_server.settings)


def test_keys_come_from_the_environment_as_a_comma_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MMENCODE_API_KEY", "alpha, beta")
    assert Settings().api_keys() == ["alpha", "beta"]


def test_without_keys_nothing_asks_for_one(qwen_server: LiveServer) -> None:
    assert httpx.get(qwen_server.url + "/v1/models").status_code == 200


def test_the_openapi_document_says_which_routes_need_a_bearer_key(keyed_server: LiveServer) -> None:
    spec = httpx.get(keyed_server.url + "/openapi.json").json()
    assert spec["components"]["securitySchemes"]["apiKey"] == {
        "type": "http", "scheme": "bearer", "description": "one of the --api-key keys"
    }  # fmt: skip
    for path, operations in spec["paths"].items():
        for operation in operations.values():
            assert ("security" in operation) == is_protected(path), path
