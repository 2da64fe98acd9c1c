"""The front door's decisions without a network: settings, reading a chat request, choosing an upstream,
and what the forwarder does with each kind of upstream answer.

The forwarder tests answer through ``httpx.MockTransport`` (httpx's own in-process transport), to reach
answers a real vLLM gives only under faults (a 503 from one server and a 200 from the next, a reset);
``tests/vllm_server/test_front_door.py`` runs the same paths against real vLLM servers.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import orjson
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from mmencode.app.api.chat.errors import UpstreamFailed, UpstreamRefused, UpstreamUnavailable
from mmencode.app.api.chat.forward import UpstreamForwarder
from mmencode.app.api.chat.request import ChatItemLocator, parse_chat
from mmencode.app.api.chat.upstreams import Upstream, UpstreamPool
from mmencode.app.cli import build_parser
from mmencode.app.config import Settings
from mmencode.app.engine.errors import ModelNotFound, UnsupportedParameter, ValidationFailed
from mmencode.app.metrics import Metrics
from mmencode.app.server import create_app
from tests.helpers import asgi_client, data_uri, free_port, noise_image

# ----- settings -----


def test_upstream_urls_are_normalised_and_deduplicated() -> None:
    settings = Settings(upstream="http://a:8001/v1/, https://b:8002/ ,http://a:8001")  # type: ignore[arg-type]
    assert settings.upstream == ["http://a:8001", "https://b:8002"]


@pytest.mark.parametrize("url", ["a:8001", "ftp://a:8001", "file:///tmp/x"])
def test_an_upstream_that_is_not_http_is_refused(url: str) -> None:
    with pytest.raises(ValidationError, match="not an http"):
        Settings(upstream=[url])


def test_the_ec_transport_needs_the_connector_directory(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="ec_shared_storage"):
        Settings(upstream=["http://a:1"], upstream_transport="ec")
    Settings(upstream=["http://a:1"], upstream_transport="ec", ec_shared_storage=tmp_path)


def test_upstream_flags_repeat_and_take_comma_lists() -> None:
    args = build_parser().parse_args(["serve", "--upstream", "http://a:1", "--upstream", "http://b:2,http://c:3"])
    assert Settings(upstream=args.upstream).upstream == ["http://a:1", "http://b:2", "http://c:3"]


async def test_a_family_vllm_takes_no_embeds_for_fails_at_start_with_the_embeds_transport(
    tiny_checkpoint: Callable[..., Path],
) -> None:
    """Gemma 3's rows reach vLLM only through the connector: fail at start, not on the first request."""
    with pytest.raises(TimeoutError, match="--upstream-transport ec"):
        async with asgi_client(model=tiny_checkpoint("gemma3"), upstream=["http://127.0.0.1:9"]):
            pass


# ----- reading a chat request -----


def _chat(*parts: object, **fields: object) -> bytes:
    return orjson.dumps({"model": "m", "messages": [{"role": "user", "content": list(parts)}], **fields})


def test_every_image_part_form_is_found_with_its_location() -> None:
    chat = parse_chat(
        _chat(
            {"type": "text", "text": "what?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "image_url", "image_url": "https://example.com/a.jpg"},
            {"type": "input_image", "image_url": "https://example.com/b.jpg"},
            {"type": "image_embeds", "image_embeds": "QUJD"},
            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        )
    )
    assert [image.path for image in chat.images] == [
        "messages[0].content[1].image_url.url",
        "messages[0].content[2].image_url",
        "messages[0].content[3].image_url",
    ]
    assert [image.source for image in chat.images] == [
        "data:image/png;base64,AAAA",
        "https://example.com/a.jpg",
        "https://example.com/b.jpg",
    ]
    locator = ChatItemLocator.of(chat)
    assert locator.paths[2] == "messages[0].content[3].image_url"


def test_a_text_only_request_has_no_images_and_keeps_every_field() -> None:
    chat = parse_chat(
        b'{"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}], "top_k": 3, '
        b'"mm_processor_kwargs": {"use_fast": false}}'
    )
    assert chat.images == [] and chat.stream and chat.body["top_k"] == 3


@pytest.mark.parametrize("field", ["mm_processor_kwargs", "media_io_kwargs"])
def test_preprocessing_fields_are_refused_beside_an_image_and_named(field: str) -> None:
    raw = _chat({"type": "image_url", "image_url": {"url": "https://example.com/a.jpg"}}, **{field: {"max_pixels": 1}})
    with pytest.raises(UnsupportedParameter) as caught:
        parse_chat(raw)
    assert caught.value.status == 400 and caught.value.param == field
    assert "max_pixels" in caught.value.message
    # Empty, it asks for nothing: accepted.
    parse_chat(_chat({"type": "image_url", "image_url": {"url": "https://example.com/a.jpg"}}, **{field: {}}))


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        (b"{not json", "body"),
        (b"[1, 2]", "body"),
        (b'{"model": "m"}', "messages"),
        (b'{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}', "image_url"),
    ],
)
def test_a_malformed_chat_request_is_a_validation_error(raw: bytes, where: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        parse_chat(raw)
    assert caught.value.status == 422 and where in str(caught.value.details)


def test_the_route_is_404_without_upstreams() -> None:
    with TestClient(create_app(Settings())) as client:
        answer = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "not_found" and "--upstream" in answer.json()["error"]["message"]


def test_the_api_key_covers_the_front_door() -> None:
    app = create_app(Settings(api_key=["s3cret-key-for-tests"], upstream=["http://127.0.0.1:9"]))
    client = TestClient(app)  # no lifespan: the key is checked before anything is loaded or sent
    answer = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_api_key"


# ----- choosing an upstream -----


def _pool(*upstreams: Upstream, transport: httpx.MockTransport | None = None) -> UpstreamPool:
    client = httpx.AsyncClient(transport=transport or httpx.MockTransport(lambda request: httpx.Response(500)))
    pool = UpstreamPool([u.url for u in upstreams], client, Metrics(), health_interval_s=5)
    pool.upstreams = list(upstreams)
    return pool


def test_the_model_picks_the_upstreams_and_an_unknown_model_is_404() -> None:
    a = Upstream("http://a", healthy=True, models=("llava",))
    b = Upstream("http://b", healthy=True, models=("qwen",))
    pool = _pool(a, b)
    assert pool.choose("qwen", []) is b
    assert pool.choose("llava", []) is a
    with pytest.raises(ModelNotFound) as caught:
        pool.require("gemma")
    assert caught.value.details["available"] == ["llava", "qwen"]
    assert pool.models() == ["llava", "qwen"]


def test_a_served_model_with_every_upstream_down_is_503_not_404() -> None:
    pool = _pool(Upstream("http://a", healthy=False, models=("qwen",), last_error="refused"))
    with pytest.raises(UpstreamUnavailable) as caught:
        pool.require("qwen")
    assert caught.value.status == 503 and "refused" in caught.value.message


def test_load_comes_before_affinity_and_affinity_before_turns() -> None:
    a, b = Upstream("http://a", healthy=True), Upstream("http://b", healthy=True)
    pool = _pool(a, b)
    pool.remember(a, ["h1"])
    # Equally loaded: the upstream that holds the image, however recently it was chosen.
    assert pool.choose(None, ["h1"]) is a
    assert pool.choose(None, ["h1"]) is a
    # Busier: the image's upstream is passed over for the idle one.
    with pool.lease(a):
        assert pool.choose(None, ["h1"]) is b
    # No image known: the one chosen longest ago, so turns alternate.
    first = pool.choose(None, ["other"])
    assert pool.choose(None, ["other"]) is not first


def test_an_upstream_that_failed_is_skipped_until_its_check_passes() -> None:
    healthy = {"flag": False}

    def answer(request: httpx.Request) -> httpx.Response:
        if not healthy["flag"]:
            raise httpx.ConnectError("refused")
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "qwen"}]})
        return httpx.Response(200)

    a, b = Upstream("http://a", healthy=True), Upstream("http://b", healthy=True)
    pool = _pool(a, b, transport=httpx.MockTransport(answer))
    pool.mark_failed(a, "connection reset")
    assert all(pool.choose(None, []) is b for _ in range(3))
    asyncio.run(pool.check_all())
    assert not a.healthy and not b.healthy
    healthy["flag"] = True
    asyncio.run(pool.check_all())
    assert a.healthy and a.models == ("qwen",)


# ----- forwarding -----


def _forwarder(handlers: dict[str, Callable[[httpx.Request], httpx.Response]]) -> tuple[UpstreamForwarder, Metrics]:
    def route(request: httpx.Request) -> httpx.Response:
        return handlers[f"{request.url.scheme}://{request.url.host}"](request)

    metrics = Metrics()
    client = httpx.AsyncClient(transport=httpx.MockTransport(route))
    ups = [Upstream(url, healthy=True) for url in handlers]
    pool = UpstreamPool([u.url for u in ups], client, metrics, health_interval_s=5)
    pool.upstreams = ups
    return UpstreamForwarder(pool, client, metrics, {}), metrics


def _streamed(status: int, body: dict[str, object]) -> httpx.Response:
    """An answer whose body arrives as a stream, as a server's does (a ``json=`` body counts as read)."""

    async def chunks() -> AsyncIterator[bytes]:
        yield orjson.dumps(body)

    return httpx.Response(status, content=chunks(), headers={"content-type": "application/json"})


def _completion(request: httpx.Request) -> httpx.Response:
    return _streamed(200, {"object": "chat.completion", "from": str(request.url.host)})


def _refused_connection(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused")


def test_a_503_or_a_refused_connection_goes_to_the_next_upstream() -> None:
    for first in (lambda request: _streamed(503, {"error": {"message": "busy"}}), _refused_connection):
        forwarder, metrics = _forwarder({"http://a": first, "http://b": _completion})
        tried: list[str] = []
        answer = asyncio.run(forwarder.open(b"{}", model=None, hashes=[], stream=False, tried=tried))
        assert tried == ["http://a", "http://b"] and b'"from":"b"' in answer.first
        assert metrics.upstream_requests.labels("http://a", "failed")._value.get() == 1


def test_an_upstream_4xx_keeps_its_status_and_message_and_is_not_retried() -> None:
    def too_long(request: httpx.Request) -> httpx.Response:
        body = {"error": {"message": "max_tokens is too large", "type": "BadRequestError", "code": 400}}
        return _streamed(400, body)

    forwarder, _ = _forwarder({"http://a": too_long, "http://b": too_long})
    tried: list[str] = []
    with pytest.raises(UpstreamRefused) as caught:
        asyncio.run(forwarder.open(b"{}", model=None, hashes=[], stream=False, tried=tried))
    assert tried == ["http://a"]
    error = caught.value
    assert (error.status, error.type, error.message) == (400, "invalid_request_error", "max_tokens is too large")
    assert error.details["upstream_error"]["type"] == "BadRequestError"


def test_when_every_upstream_fails_the_answer_is_502_naming_each() -> None:
    forwarder, _ = _forwarder({"http://a": _refused_connection, "http://b": _refused_connection})
    with pytest.raises(UpstreamFailed) as caught:
        asyncio.run(forwarder.open(b"{}", model=None, hashes=[], stream=False))
    assert caught.value.status == 502
    assert [attempt["upstream"] for attempt in caught.value.details["attempts"]] == ["http://a", "http://b"]


# ----- readiness and the model list with upstreams (a small local upstream: the encoder is the real one) -----
class _Upstream:
    """An OpenAI-compatible server on loopback serving one chat model; it echoes the model it was asked."""

    def __init__(self, port: int) -> None:
        served = "tiny-chat"

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def _json(self, body: dict[str, object]) -> None:
                data = orjson.dumps(body)
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._json({"data": [{"id": served}]} if self.path == "/v1/models" else {})

            def do_POST(self) -> None:
                asked = orjson.loads(self.rfile.read(int(self.headers["content-length"])))
                self._json({"object": "chat.completion", "model": asked["model"], "choices": []})

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def _until(client: httpx.AsyncClient, status: int) -> httpx.Response:
    for _ in range(600):
        answer = await client.get("/ready")
        if answer.status_code == status and (status == 200 or answer.json()["error"]["details"].get("upstreams")):
            return answer
        await asyncio.sleep(0.05)
    raise AssertionError(f"/ready never answered {status}: {answer.text}")


async def test_ready_is_503_while_no_upstream_is_healthy_and_200_once_one_is(checkpoints: dict[str, Path]) -> None:
    port = free_port()
    settings = Settings(
        model=checkpoints["qwen2_vl"], upstream=[f"http://127.0.0.1:{port}"], upstream_health_interval=0.2
    )
    app = create_app(settings)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://door.test") as client,
    ):
        down = await _until(client, 503)
        error = down.json()["error"]
        assert error["code"] == "not_ready" and f"127.0.0.1:{port}" in error["message"]
        assert [u["healthy"] for u in error["details"]["upstreams"]] == [False]
        assert (await client.get("/health")).status_code == 200  # liveness is not readiness
        upstream = _Upstream(port)
        try:
            ready = await _until(client, 200)
            assert [u["healthy"] for u in ready.json()["upstreams"]] == [True]
            models = (await client.get("/v1/models")).json()["data"]
            # What a chat client can use comes first; the encoder's own id stays, marked with its routes.
            assert [(m["id"], m["endpoints"]) for m in models] == [
                ("tiny-chat", ["/v1/chat/completions"]),
                (checkpoints["qwen2_vl"].name, ["/v1/encode", "/v1/embeddings"]),
            ]
            # The encoder's id, which a client may have taken from an older list, names the one chat model.
            chat = {"model": checkpoints["qwen2_vl"].name, "messages": [{"role": "user", "content": "hi"}]}
            answer = await client.post("/v1/chat/completions", json=chat)
            assert answer.status_code == 200, answer.text
            assert answer.json()["model"] == "tiny-chat"
        finally:
            upstream.stop()


async def test_a_chat_requests_access_line_names_its_images_and_their_rows(
    checkpoints: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """The access line of a chat request the door encoded for says how many items and rows it sent on."""
    port = free_port()
    upstream = _Upstream(port)
    try:
        caplog.set_level(logging.DEBUG, logger="mmencode.access")
        async with asgi_client(model=checkpoints["qwen2_vl"], upstream=[f"http://127.0.0.1:{port}"]) as client:
            await _until(client, 200)
            part = {"type": "image_url", "image_url": {"url": data_uri(noise_image(56, 56, seed=5))}}
            chat = {"model": "tiny-chat", "messages": [{"role": "user", "content": [part]}]}
            answer = await client.post("/v1/chat/completions", json=chat)
            assert answer.status_code == 200, answer.text
    finally:
        upstream.stop()
    lines = [r.getMessage() for r in caplog.records if " /v1/chat/completions 200 " in r.getMessage()]
    assert len(lines) == 1, lines
    # 56x56 on Qwen2-VL: 4x4 patches of 14 pixels, merged 2x2 into 4 rows.
    assert " items=1 tokens=4 " in lines[0], lines[0]
