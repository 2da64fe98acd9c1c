"""Mooncake pushes through the app, without a vLLM: the front door's ``mooncake`` transport and ``/v1/encode``'s
``ec_transfer_params``, against an in-process consumer (tests.helpers.FakeConsumer: vLLM 0.32's control
protocol, a pool written by a real Mooncake engine) and a local upstream that records what it was sent.

What a real vLLM consumer answers from the pushed rows: tests/vllm_server/test_mooncake.py.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import torch
from pydantic import ValidationError

from mmencode.app.config import Settings
from tests.helpers import FakeConsumer, asgi_client, data_uri, decode_rows, noise_image

IMAGE = noise_image(61, 45, seed=421)
OTHER = noise_image(45, 61, seed=422)


class RecordingUpstream:
    """An OpenAI-compatible chat server on loopback: keeps each request's body and the consumer's reservation
    states when it arrived (what vLLM would find), and answers a fixed completion (or ``status``)."""

    def __init__(self, consumer: FakeConsumer) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.states_on_arrival: list[dict[str, str]] = []
        self.status = 200
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = orjson.dumps(body)
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._send(200, {"data": [{"id": "tiny"}]} if self.path == "/v1/models" else {})

            def do_POST(self) -> None:
                recorder.states_on_arrival.append(consumer.states())
                recorder.bodies.append(orjson.loads(self.rfile.read(int(self.headers["content-length"]))))
                if recorder.status != 200:
                    self._send(recorder.status, {"error": {"message": "refused by the test", "code": 400}})
                else:
                    self._send(200, {"object": "chat.completion", "model": "tiny", "choices": []})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def shared_consumer() -> Iterator[FakeConsumer]:
    with FakeConsumer() as fake:
        yield fake


@pytest.fixture
def consumer(shared_consumer: FakeConsumer) -> FakeConsumer:
    shared_consumer.reset()
    return shared_consumer


@pytest.fixture(scope="module")
def upstream(shared_consumer: FakeConsumer) -> Iterator[RecordingUpstream]:
    server = RecordingUpstream(shared_consumer)
    yield server
    server.close()


@pytest.fixture(scope="module")
async def door(
    checkpoints: dict[str, Path], shared_consumer: FakeConsumer, upstream: RecordingUpstream
) -> AsyncIterator[httpx.AsyncClient]:
    """The app with the mooncake transport in front of the recording upstream, and pushes from /v1/encode."""
    async with asgi_client(
        model=checkpoints["qwen2_vl"],
        upstream=[upstream.url],
        upstream_transport="mooncake",
        upstream_ec_control=[shared_consumer.control.removeprefix("tcp://")],
        ec_push_consumers=[shared_consumer.control],
        mooncake_push_timeout=5.0,
        mooncake_control_timeout=1.0,
    ) as client:
        yield client


@pytest.fixture
def sent(upstream: RecordingUpstream) -> RecordingUpstream:
    upstream.bodies.clear()
    upstream.states_on_arrival.clear()
    upstream.status = 200
    return upstream


def _chat(*parts: dict[str, Any], **fields: Any) -> dict[str, Any]:
    content = [*parts, {"type": "text", "text": "What is it?"}]
    return {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 1, **fields}


def _image(image: Any) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_uri(image)}}


async def _rows(door: httpx.AsyncClient, *images: Any) -> list[dict[str, Any]]:
    answer = await door.post("/v1/encode", json={"items": [{"image": data_uri(i)} for i in images]})
    assert answer.status_code == 200, answer.text
    return answer.json()["items"]


def _pushes(door_metrics: str, result: str) -> float:
    """``mmencode_mooncake_pushes_total`` for ``result`` (0 before the first)."""
    prefix = f'mmencode_mooncake_pushes_total{{result="{result}"}} '
    return sum(float(line.removeprefix(prefix)) for line in door_metrics.splitlines() if line.startswith(prefix))


def _tensor(embedding: dict[str, Any]) -> torch.Tensor:
    return torch.from_numpy(decode_rows(embedding))


# ----- settings -----


def test_the_mooncake_transport_needs_one_control_address_per_upstream() -> None:
    with pytest.raises(ValidationError, match="one upstream_ec_control address per upstream"):
        Settings(upstream=["http://a:1", "http://b:2"], upstream_transport="mooncake", upstream_ec_control=["a:9"])
    settings = Settings(
        upstream="http://a:1,http://b:2",  # type: ignore[arg-type]
        upstream_transport="mooncake",
        upstream_ec_control="a:9, tcp://b:10",  # type: ignore[arg-type]
    )
    assert settings.upstream_ec_control == ["tcp://a:9", "tcp://b:10"]
    assert settings.mooncake


@pytest.mark.parametrize("address", ["a", "a:0", "a:port", "http://a:9", "tcp://a:9/x"])
def test_a_control_address_that_is_not_host_port_is_refused(address: str) -> None:
    with pytest.raises(ValidationError, match="not a consumer control address"):
        Settings(ec_push_consumers=[address])


def test_control_addresses_without_the_mooncake_transport_are_refused() -> None:
    with pytest.raises(ValidationError, match="set upstream_transport mooncake"):
        Settings(upstream=["http://a:1"], upstream_ec_control=["a:9"])
    assert Settings(ec_push_consumers=["*"]).ec_push_consumers == ["*"]


# ----- the front door -----


async def test_the_rows_are_complete_on_the_consumer_before_the_request_goes_upstream(
    door: httpx.AsyncClient, consumer: FakeConsumer, sent: RecordingUpstream
) -> None:
    answer = await door.post("/v1/chat/completions", json=_chat(_image(IMAGE), _image(OTHER)))
    assert answer.status_code == 200, answer.text
    [body] = sent.bodies
    expected = await _rows(door, IMAGE, OTHER)
    parts = body["messages"][0]["content"]
    # Metadata only: the grid and vLLM's identifier for each item, no rows, no image.
    assert parts[:2] == [
        {
            "type": "image_embeds",
            "image_embeds": {"image_grid_thw": item["metadata"]["image_grid_thw"]},
            "uuid": item["hash"],
        }
        for item in expected
    ]
    items = body["ec_transfer_params"]["ec_items"]
    assert [item["mm_hash"] for item in items] == [item["hash"] for item in expected]
    # Complete (ready) on the consumer when the request arrived, holding mmencode's rows.
    assert sent.states_on_arrival == [{item["transfer_id"]: "READY" for item in items}]
    for item, encoded in zip(items, expected, strict=True):
        assert torch.equal(consumer.rows(item["transfer_id"]), _tensor(encoded["embedding"]))


async def test_the_same_image_twice_is_pushed_once_and_named_twice(
    door: httpx.AsyncClient, consumer: FakeConsumer, sent: RecordingUpstream
) -> None:
    answer = await door.post("/v1/chat/completions", json=_chat(_image(IMAGE), _image(IMAGE)))
    assert answer.status_code == 200, answer.text
    first, second = sent.bodies[0]["ec_transfer_params"]["ec_items"]
    assert first == second
    assert list(consumer.states()) == [first["transfer_id"]]


async def test_a_refused_push_answers_503_and_sends_nothing(
    door: httpx.AsyncClient, consumer: FakeConsumer, sent: RecordingUpstream
) -> None:
    before = _pushes((await door.get("/metrics")).text, "refused")
    consumer.refuse = "EC consumer buffer pool is full"
    answer = await door.post("/v1/chat/completions", json=_chat(_image(IMAGE)))
    assert answer.status_code == 503
    error = answer.json()["error"]
    assert error["code"] == "ec_push_failed" and answer.headers["retry-after"] == "1"
    assert "buffer pool is full" in error["message"]
    assert error["details"]["stage"] == "reserve"
    assert [attempt["upstream"] for attempt in error["details"]["attempts"]] == [sent.url]
    assert sent.bodies == []
    assert _pushes((await door.get("/metrics")).text, "refused") == before + 1


async def test_a_push_whose_request_is_refused_upstream_is_cancelled(
    door: httpx.AsyncClient, consumer: FakeConsumer, sent: RecordingUpstream
) -> None:
    sent.status = 400
    answer = await door.post("/v1/chat/completions", json=_chat(_image(OTHER)))
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "upstream_error"
    for _ in range(100):
        if set(consumer.states().values()) == {"CANCELLED"}:
            break
        await asyncio.sleep(0.02)
    assert set(consumer.states().values()) == {"CANCELLED"}


@pytest.mark.parametrize(
    ("part", "param"),
    [
        ({"type": "video_url", "video_url": {"url": "https://example.com/a.mp4"}}, "messages[0].content[1]"),
        ({"type": "image_embeds", "image_embeds": "QUJD"}, "messages[0].content[1]"),
    ],
)
async def test_media_the_door_does_not_encode_is_refused_before_any_work(
    door: httpx.AsyncClient, consumer: FakeConsumer, sent: RecordingUpstream, part: dict[str, Any], param: str
) -> None:
    answer = await door.post("/v1/chat/completions", json=_chat(_image(IMAGE), part))
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == ("unsupported_parameter", param)
    assert "computes no item itself" in error["message"]
    assert sent.bodies == [] and consumer.calls == []


async def test_ec_transfer_params_are_the_doors_to_write(door: httpx.AsyncClient, sent: RecordingUpstream) -> None:
    answer = await door.post("/v1/chat/completions", json=_chat(_image(IMAGE), ec_transfer_params={"ec_items": []}))
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "ec_transfer_params"
    assert sent.bodies == []


# ----- /v1/encode with a push target -----


async def test_encode_pushes_then_answers_the_chat_requests_transfer_params(
    door: httpx.AsyncClient, consumer: FakeConsumer
) -> None:
    expected = await _rows(door, IMAGE, OTHER)
    body = {
        "items": [{"image": data_uri(IMAGE)}, {"image": data_uri(OTHER)}],
        "dtype": "bfloat16",
        "ec_transfer_params": {
            "consumer_zmq": consumer.control,
            "ec_items": [{"transfer_id": "p-1"}, {"transfer_id": "p-2"}],
        },
    }
    answer = await door.post("/v1/encode", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/json"
    pushed = answer.json()
    assert [item["embedding"] for item in pushed["items"]] == [None, None]
    assert pushed["ec_transfer_params"] == {
        "ec_items": [
            {"mm_hash": item["hash"], "transfer_id": tid} for item, tid in zip(expected, ("p-1", "p-2"), strict=True)
        ]
    }
    assert consumer.states() == {"p-1": "READY", "p-2": "READY"}
    for transfer_id, item in zip(("p-1", "p-2"), expected, strict=True):
        assert torch.equal(consumer.rows(transfer_id), _tensor(item["embedding"]).to(torch.bfloat16))


async def test_encode_makes_transfer_ids_when_none_are_given(door: httpx.AsyncClient, consumer: FakeConsumer) -> None:
    body = {"items": [{"image": data_uri(IMAGE)}], "ec_transfer_params": {"consumer_zmq": consumer.control}}
    answer = await door.post("/v1/encode", json=body)
    assert answer.status_code == 200, answer.text
    [item] = answer.json()["ec_transfer_params"]["ec_items"]
    assert consumer.states() == {item["transfer_id"]: "READY"}


async def test_encode_pushes_only_where_the_server_allows(door: httpx.AsyncClient, consumer: FakeConsumer) -> None:
    body = {"items": [{"image": data_uri(IMAGE)}], "ec_transfer_params": {"consumer_zmq": "tcp://10.0.0.1:5555"}}
    answer = await door.post("/v1/encode", json=body)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == ("unsupported_parameter", "ec_transfer_params.consumer_zmq")
    assert "--ec-push-consumers" in error["message"]
    assert consumer.calls == []


async def test_a_failed_encode_push_answers_503(door: httpx.AsyncClient, consumer: FakeConsumer) -> None:
    consumer.lose_on_complete = True
    body = {"items": [{"image": data_uri(OTHER)}], "ec_transfer_params": {"consumer_zmq": consumer.control}}
    answer = await door.post("/v1/encode", json=body)
    assert answer.status_code == 503
    assert answer.json()["error"]["code"] == "ec_push_failed"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"encoding_format": "safetensors"}, "no `safetensors`"),
        ({"pooling": "mean"}, "no `pooling`"),
        ({"ec_items": [{"transfer_id": "a"}, {"transfer_id": "b"}]}, "2 entries for 1 items"),
        ({"ec_items": [{"transfer_id": "a"}], "items": 2}, "make them unique"),
    ],
)
async def test_encode_push_requests_that_contradict_themselves_are_refused(
    door: httpx.AsyncClient, consumer: FakeConsumer, fields: dict[str, Any], message: str
) -> None:
    """What the schema states is a validation_error (422); what it cannot (counts, uniqueness) is 400."""
    target: dict[str, Any] = {"consumer_zmq": consumer.control}
    if "ec_items" in fields:
        target["ec_items"] = fields.pop("ec_items") * fields.get("items", 1)
    items = [{"image": data_uri(IMAGE)}] * fields.pop("items", 1)
    answer = await door.post("/v1/encode", json={"items": items, "ec_transfer_params": target, **fields})
    assert answer.status_code == (400 if "ec_items" in target else 422), answer.text
    assert message in answer.json()["error"]["message"]
    if "ec_items" in target:
        assert answer.json()["error"]["param"] == "ec_transfer_params.ec_items"
    assert consumer.ops() == []  # refused before any push


async def test_a_server_without_pushes_refuses_a_push_target(qwen_app: httpx.AsyncClient) -> None:
    body = {"items": [{"image": data_uri(IMAGE)}], "ec_transfer_params": {"consumer_zmq": "tcp://127.0.0.1:9"}}
    answer = await qwen_app.post("/v1/encode", json=body)
    assert answer.status_code == 400
    assert "--ec-push-consumers" in answer.json()["error"]["message"]
