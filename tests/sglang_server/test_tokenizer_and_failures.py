"""SGLang's split over ``zmq_to_tokenizer``, an encoder that finds its language server by itself, and what a
client sees when mmencode fails: an item it refuses, rows that do not fit their grid, an encoder that is not
there, an encoder killed mid-request. SGLang never hangs or dies; the client gets SGLang's own 503 (its
language server names no encoder error to the client, whoever the encoder is), mmencode's error with the
item named reaches the language server's log, and the next request is served.

``zmq_to_tokenizer`` because with ``zmq_to_scheduler`` SGLang 0.5.23's language server dies of any encoder
failure, its own encoder's included (``managers/scheduler_components/output_streamer.py:493``: README, "Use
with SGLang"); the answers on that transport are tests/sglang_server/test_answers.py's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.peers.sglang.server import SGLangServer, chat, chat_body, dispatched_items, register, sglang_server
from mmencode.models.tiny import build_tiny
from tests.helpers import data_uri, free_port, mmencode_process, noise_image, plain_mmencode

IMAGE = noise_image(168, 112, seed=501)
TOLERANCE = 1e-4


def _part(image: Any = IMAGE) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_uri(image)}}


@dataclass
class Door:
    root: Path
    checkpoint: Path
    language: SGLangServer
    sglang: SGLangServer
    mmencode: str

    def post(self, parts: list[dict[str, Any]]) -> httpx.Response:
        httpx.post(self.language.url + "/flush_cache", timeout=30)
        return httpx.post(self.language.url + "/v1/chat/completions", json=chat_body(parts), timeout=120)


def _enter(stack: contextlib.ExitStack, manager: contextlib.AbstractContextManager[Any]) -> Any:
    return stack.enter_context(manager)


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Door]:
    root = tmp_path_factory.mktemp("sglang-tokenizer")
    checkpoint = build_tiny(root / "model", "qwen2_vl", layout="servable")
    transport = "zmq_to_tokenizer"
    servers = [
        sglang_server(checkpoint, root / "language.log", role="language", transport=transport),
        sglang_server(checkpoint, root / "encoder.log", role="encoder", transport=transport),
        mmencode_process(plain_mmencode(), "--model", str(checkpoint), log=root / "mmencode.log"),
    ]
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(max_workers=3) as starter:
        language, sglang, mmencode = (f.result() for f in [starter.submit(_enter, stack, s) for s in servers])
        yield Door(root, checkpoint, language, sglang, mmencode)


def test_zmq_to_tokenizer_gives_sglangs_own_answer(door: Door) -> None:
    register(door.language, door.sglang.url)
    reference = chat(door.language, [_part()])
    register(door.language, door.mmencode)
    before = dispatched_items(door.language)
    ours = chat(door.language, [_part()])
    assert dispatched_items(door.language) > before
    assert (ours.prompt_tokens, ours.tokens) == (reference.prompt_tokens, reference.tokens)
    assert ours.same_top_tokens(reference) and ours.max_logprob_difference(reference) <= TOLERANCE


def _refused_then_served(door: Door, encoder: str, expected_in_log: str) -> None:
    register(door.language, encoder)
    started = time.monotonic()
    refused = door.post([_part()])
    assert refused.status_code == 503, refused.text
    assert "encoder did not return multimodal embeddings" in refused.json()["message"]
    assert time.monotonic() - started < 30
    assert expected_in_log in door.language.log_text()
    register(door.language, door.mmencode)
    assert door.post([_part()]).status_code == 200  # SGLang serves on


def test_an_item_mmencode_refuses_is_a_503_and_its_message_names_the_item(door: Door) -> None:
    with mmencode_process(
        plain_mmencode(), "--model", str(door.checkpoint), "--max-image-pixels", "1000", log=door.root / "small.log"
    ) as strict:
        _refused_then_served(door, strict, "payload_too_large: mm_items[0]: image is 168x112")


def test_rows_that_do_not_fit_their_grid_never_reach_the_model(door: Door) -> None:
    """mmencode checks every item's rows against its grid (here the processor merges 1x1 while the tower
    merges 2x2): the drift is an error naming the numbers, never rows on the wrong placeholders."""
    mismatched = build_tiny(door.root / "mismatched", "qwen2_vl", processor_merge_size=1)
    with mmencode_process(plain_mmencode(), "--model", str(mismatched), log=door.root / "drift.log") as drifting:
        _refused_then_served(door, drifting, "token_count_mismatch")


def test_an_encoder_that_is_not_there_is_a_quick_503(door: Door) -> None:
    _refused_then_served(door, f"http://127.0.0.1:{free_port()}", "Encoder dispatch failed")


def test_an_encoder_killed_mid_request_is_a_503_and_a_restarted_one_finds_its_language_server(door: Door) -> None:
    """mmencode announced with --sglang-register-url: listed once ready, unlisted when it drains. Killed with
    work in flight, the client gets a 503 at once; started again, it registers again and serves."""
    args = ["--model", str(door.checkpoint), "--sglang-register-url", door.language.bootstrap_url]
    register(door.language, door.sglang.url)  # then only mmencode, once it registers itself
    httpx.request("DELETE", door.language.bootstrap_url + "/unregister_encoder_url", json={"url": door.sglang.url})
    port = free_port()
    registered = f"http://127.0.0.1:{port}"
    processes: list[subprocess.Popen[bytes]] = []
    with mmencode_process(
        plain_mmencode(), *args, port=port, log=door.root / "kill.log", started=processes.append
    ) as url:
        assert url == registered
        _wait_until(lambda: door.language.encoder_urls() == [registered])
        big = [_part(noise_image(1600, 1200, seed=502 + i)) for i in range(4)]
        answers: list[httpx.Response] = []
        sender = threading.Thread(target=lambda: answers.append(door.post(big)))
        sender.start()
        _wait_until(lambda: "Sending encode request" in door.language.log_text()[-20000:])
        time.sleep(0.3)
        os.killpg(processes[0].pid, signal.SIGKILL)  # its own process group: nothing drains
        sender.join(timeout=60)
        assert answers and answers[0].status_code == 503, answers
    with mmencode_process(plain_mmencode(), *args, port=port, log=door.root / "again.log"):
        _wait_until(lambda: door.language.encoder_urls() == [registered])
        assert door.post([_part()]).status_code == 200
    # A drain unregisters it: the language server no longer sends it anything.
    _wait_until(lambda: door.language.encoder_urls() == [])


def _wait_until(condition: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if condition():
                return
        time.sleep(0.2)
    raise AssertionError("timed out waiting")
