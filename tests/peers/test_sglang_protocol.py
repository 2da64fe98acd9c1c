"""SGLang 0.5.23's encoder protocol against a live mmencode, decoded by SGLang's own code.

Each test plays SGLang's language server: a ZMQ PULL socket on loopback in the peers venv (where
``safe_pickle_loads`` decodes frame 0), and ``POST /encode`` / ``/scheduler_receive_url`` bodies in the
shapes sglang 0.5.23's receiver sends.
"""

from __future__ import annotations

import base64
import hashlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from tests.helpers import LiveServer, clip, data_uri, free_port, live_server, noise_image, rows_of, video_data_uri
from tests.peers.run import SGLangReceiver

IMAGES = [data_uri(noise_image(56, 56, seed=71)), data_uri(noise_image(112, 56, seed=72))]
# SGLang's EmbeddingData.copy_without_embedding() keeps exactly these.
ATTRIBUTES = sorted(
    [
        "req_id",
        "num_parts",
        "part_idx",
        "grid_dim",
        "modality",
        "embedding",
        "send_time",
        "dtype",
        "shape",
        "_mr_ptr",
        "error_msg",
        "error_code",
    ]
)


def _encode_body(req_id: str, mm_items: list[Any], embedding_port: Any, **extra: Any) -> dict[str, Any]:
    # As sglang/srt/disaggregation/encoder/receiver.py builds it.
    return {
        "encoder_idx": 0,
        "encoder_url": "http://mmencode",
        "mm_items": mm_items,
        "num_parts": 1,
        "part_idx": 0,
        "req_id": req_id,
        "modality": "IMAGE",
        "prefill_host": "127.0.0.1",
        "embedding_port": embedding_port,
        "time_stats_json": None,
        **extra,
    }


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[SGLangReceiver]:
    pull = SGLangReceiver(tmp_path, count=1)
    yield pull
    pull.close()


def _reference(server: LiveServer) -> tuple[torch.Tensor, list[list[int]]]:
    with server.client() as client:
        body = client.post("/v1/encode", json={"items": [{"image": image} for image in IMAGES]}).json()
    rows = torch.cat([rows_of(item) for item in body["items"]])
    return rows, [item["metadata"]["image_grid_thw"] for item in body["items"]]


def _assert_embedding(message: dict[str, Any], req_id: str, rows: torch.Tensor, grids: list[list[int]]) -> None:
    assert message["class"] == "sglang.srt.disaggregation.encoder.receiver.EmbeddingData"
    assert message["is_sglang_class"] and message["frames"] == 2
    assert message["attributes"] == ATTRIBUTES
    assert (message["req_id"], message["num_parts"], message["part_idx"]) == (req_id, 1, 0)
    assert message["modality"] == "sglang.srt.multimodal.modality.<Modality.IMAGE: 1>"
    assert message["error_msg"] is None and message["error_code"] is None
    # The encoder's compute dtype by default (--sglang-dtype auto): float32 on a CPU, as SGLang's own encoder.
    assert message["dtype"] == torch.float32 and message["shape"] == list(rows.shape)
    assert torch.equal(message["embedding"], rows)
    assert message["grid"].tolist() == grids


def test_zmq_to_tokenizer_two_images(qwen_server: LiveServer, receiver: SGLangReceiver) -> None:
    rows, grids = _reference(qwen_server)
    with qwen_server.client() as client:
        response = client.post("/encode", json=_encode_body("r1_local_part_0", IMAGES, receiver.port))
    assert response.status_code == 200, response.text
    assert response.json() is None
    [message] = receiver.messages()
    _assert_embedding(message, "r1_local_part_0", rows, grids)
    assert grids == [[1, 4, 4], [1, 4, 8]]


def test_dict_items_with_content_hash(qwen_server: LiveServer, receiver: SGLangReceiver) -> None:
    rows, grids = _reference(qwen_server)
    items = [
        {"url": image, "content_hash": "sha256:" + hashlib.sha256(base64.b64decode(image.split(",", 1)[1])).hexdigest()}
        for image in IMAGES
    ]
    with qwen_server.client() as client:
        response = client.post("/encode", json=_encode_body("r2_local_part_0", items, receiver.port))
    assert response.status_code == 200, response.text
    _assert_embedding(receiver.messages()[0], "r2_local_part_0", rows, grids)


def test_a_wrong_content_hash_is_an_error_message_not_an_embedding(
    qwen_server: LiveServer, receiver: SGLangReceiver
) -> None:
    items = [{"url": IMAGES[0], "content_hash": "sha256:" + "0" * 64}]
    with qwen_server.client() as client:
        response = client.post("/encode", json=_encode_body("r3_local_part_0", items, receiver.port))
    assert response.status_code == 400
    body = response.json()
    assert body["status"] == "error" and body["req_id"] == "r3_local_part_0"
    assert body["error"]["code"] == "invalid_image" and "content hash mismatch" in body["message"]
    [message] = receiver.messages()
    assert message["frames"] == 1 and message["error_code"] == 400
    assert message["error_msg"].startswith("invalid_image:") and "content hash mismatch" in message["error_msg"]


@pytest.mark.parametrize("registered_first", [1, 0], ids=["one-rank-before-encode", "all-ranks-after-encode"])
def test_zmq_to_scheduler_registration(qwen_server: LiveServer, tmp_path: Path, registered_first: int) -> None:
    rows, grids = _reference(qwen_server)
    ranks = [SGLangReceiver(tmp_path, count=1, name=f"rank{i}") for i in range(2)]
    req_id = f"r4_{registered_first}_local_part_0"
    try:

        def register(rank: SGLangReceiver) -> httpx.Response:
            return httpx.post(
                qwen_server.url + "/scheduler_receive_url",
                json={
                    "req_id": req_id,
                    "receive_count": 2,
                    "receive_url": f"127.0.0.1:{rank.port}",
                    "modality": "IMAGE",
                },
            )

        # Registrations may come before /encode arrives or while it runs.
        for rank in ranks[:registered_first]:
            assert register(rank).status_code == 200
        answer: dict[str, httpx.Response] = {}
        encode = threading.Thread(
            target=lambda: answer.update(
                r=httpx.post(qwen_server.url + "/encode", json=_encode_body(req_id, IMAGES, None), timeout=60)
            )
        )
        encode.start()
        time.sleep(0.5)
        for rank in ranks[registered_first:]:
            assert register(rank).status_code == 200
        encode.join(60)
        assert answer["r"].status_code == 200, answer["r"].text
        for rank in ranks:
            _assert_embedding(rank.messages()[0], req_id, rows, grids)
    finally:
        for rank in ranks:
            rank.close()


def test_embedding_port_list_pushes_to_each(qwen_server: LiveServer, tmp_path: Path) -> None:
    rows, grids = _reference(qwen_server)
    ranks = [SGLangReceiver(tmp_path, count=1, name=f"port{i}") for i in range(2)]
    try:
        with qwen_server.client() as client:
            response = client.post("/encode", json=_encode_body("r5_local_part_0", IMAGES, [r.port for r in ranks]))
        assert response.status_code == 200, response.text
        for rank in ranks:
            _assert_embedding(rank.messages()[0], "r5_local_part_0", rows, grids)
    finally:
        for rank in ranks:
            rank.close()


def test_token_drift_reaches_sglang_as_an_error(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    receiver = SGLangReceiver(tmp_path, count=1)
    try:
        with (
            live_server(model=checkpoints["qwen2_vl-mismatched"], cache_dir=tmp_path / "c") as server,
            server.client() as client,
        ):
            response = client.post("/encode", json=_encode_body("r6_local_part_0", IMAGES, receiver.port))
            # The same numbers as mmencode's own HTTP answer.
            http_error = client.post("/v1/encode", json={"items": [{"image": image} for image in IMAGES]}).json()
        assert response.status_code == 500
        body = response.json()
        assert body["status"] == "error" and body["req_id"] == "r6_local_part_0"
        assert body["error"]["code"] == "token_count_mismatch"
        assert body["error"]["details"] == http_error["error"]["details"]
        assert "produced 12 rows" in body["message"] and "predicted 48" in body["message"]
        [message] = receiver.messages()
        assert message["frames"] == 1 and message["is_sglang_class"]
        assert message["req_id"] == "r6_local_part_0" and message["error_code"] == 500
        assert message["error_msg"] == body["message"]
        assert message["embedding"] is None and message["shape"] is None
    finally:
        receiver.close()


def test_a_gone_language_server_never_blocks(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    with (
        live_server(model=checkpoints["qwen2_vl"], cache_dir=tmp_path / "c", sglang_push_timeout=1.0) as server,
        server.client() as client,
    ):
        started = time.monotonic()
        response = client.post("/encode", json=_encode_body("r7_local_part_0", IMAGES[:1], port))
        assert response.status_code == 504, response.text
        assert response.json()["error"]["code"] == "timeout"
        assert time.monotonic() - started < 20
        # The worker serves on.
        assert client.post("/v1/encode", json={"items": [{"image": IMAGES[0]}]}).status_code == 200

        # zmq_to_scheduler where one of two announced ranks never registers: the one that did gets the
        # embedding, and the answer says the delivery is incomplete.
        rank = SGLangReceiver(tmp_path, count=1)
        try:
            registration = {"req_id": "r10_local_part_0", "receive_count": 2, "receive_url": f"127.0.0.1:{rank.port}"}
            assert client.post("/scheduler_receive_url", json=registration).status_code == 200
            partial = client.post("/encode", json=_encode_body("r10_local_part_0", IMAGES[:1], None))
            assert partial.status_code == 504 and "only 1 of 2 scheduler ranks" in partial.json()["message"]
            assert rank.messages()[0]["error_msg"] is None
        finally:
            rank.close()


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
def test_a_video_part_reaches_sglang_with_its_grid_and_timing(
    tiny_checkpoint: Any, tmp_path: Path, receiver: SGLangReceiver, family: str
) -> None:
    """Two clips as one VIDEO part: the rows, Modality.VIDEO, the video grids as ``grid_dim`` and, on
    Qwen2.5-VL, each clip's ``second_per_grid_ts``, as SGLang's own encoder sends them (Qwen2-VL has none).
    The route samples as SGLang's encoder does (its own frame choice): the same as /v1/encode asked so."""
    clips = [video_data_uri(clip(9, 80, 60, fps=10, seed=81)), video_data_uri(clip(6, 52, 70, fps=4, seed=82))]
    with live_server(model=tiny_checkpoint(family)) as server, server.client() as client:
        asked = {"items": [{"video": c, "sampling": "sglang"} for c in clips]}
        items = client.post("/v1/encode", json=asked).json()["items"]
        body = {**_encode_body("v1_local_part_0", clips, receiver.port), "modality": "VIDEO"}
        response = client.post("/encode", json=body)
    assert response.status_code == 200, response.text
    [message] = receiver.messages()
    assert message["modality"] == "sglang.srt.multimodal.modality.<Modality.VIDEO: 2>"
    assert message["is_sglang_class"] and message["error_msg"] is None
    assert torch.equal(message["embedding"], torch.cat([rows_of(i) for i in items]))
    assert message["grid"].tolist() == [i["metadata"]["video_grid_thw"] for i in items]
    if family == "qwen2_vl":
        assert message["second_per_grid_ts"] is None and all("second_per_grid_ts" not in i["metadata"] for i in items)
    else:
        # SGLang's encoder: temporal_patch_size over the rate it samples at (2 a second), whatever the clip's.
        assert message["second_per_grid_ts"] == [i["metadata"]["second_per_grid_ts"] for i in items] == [1.0, 1.0]


@pytest.mark.parametrize("family", ["qwen3_vl", "qwen3_5"])
def test_a_qwen3_vl_video_part_carries_its_timestamps_as_sglang_names_them(
    tiny_checkpoint: Any, receiver: SGLangReceiver, family: str
) -> None:
    """Qwen3-VL and Qwen3.5 write ``<t seconds>`` before each temporal patch: SGLang's encoder sends the
    clip's per-patch times as ``video_timestamps``, which its receiver hands the language model's processor."""
    clips = [video_data_uri(clip(9, 80, 60, fps=10, seed=83)), video_data_uri(clip(13, 64, 48, fps=5, seed=84))]
    with live_server(model=tiny_checkpoint(family, layout="servable")) as server, server.client() as client:
        asked = {"items": [{"video": c, "sampling": "sglang"} for c in clips]}
        items = client.post("/v1/encode", json=asked).json()["items"]
        body = {**_encode_body("v2_local_part_0", clips, receiver.port), "modality": "VIDEO"}
        response = client.post("/encode", json=body)
    assert response.status_code == 200, response.text
    [message] = receiver.messages()
    assert message["modality"] == "sglang.srt.multimodal.modality.<Modality.VIDEO: 2>"
    assert message["grid"].tolist() == [i["metadata"]["video_grid_thw"] for i in items]
    # SGLang's frame choice (the route's): 9 frames at 10 fps are 1.8 frames' worth at 2 fps, at least 4 ->
    # linspace(0, 8, 4) truncated: 0, 2, 5, 8; 13 at 5 fps are 5.2, floored to 4 -> 0, 4, 8, 12. A patch's
    # time is its two frames' mean: [0.1, 0.65] and [0.4, 2.0] s.
    assert message["video_timestamps"] == [i["metadata"]["timestamps"] for i in items]
    assert message["video_timestamps"] == [pytest.approx([0.1, 0.65]), pytest.approx([0.4, 2.0])]
    assert message["second_per_grid_ts"] is None


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"req_id": None}, "req_id"),
        ({"mm_items": []}, "mm_items"),
        ({"num_parts": 1, "part_idx": 3}, "part_idx"),
    ],
)
def test_an_unknown_request_shape_is_refused_clearly(
    qwen_server: LiveServer, change: dict[str, Any], field: str
) -> None:
    body = {**_encode_body("r8_local_part_0", IMAGES[:1], free_port()), **change}
    with qwen_server.client() as client:
        response = client.post("/encode", json=body)
    assert response.status_code in (400, 422)
    answer = response.json()
    assert answer["status"] == "error" and field in answer["message"]
    assert "Traceback" not in answer["message"]


def test_a_modality_the_model_does_not_take_is_refused_to_the_caller_and_to_sglang(
    qwen_server: LiveServer, receiver: SGLangReceiver
) -> None:
    # A well-formed request the image model cannot serve: refused once the items are read, so the
    # language side, waiting on its port, hears the refusal too (an unreachable one would hold the
    # answer for the push timeout).
    body = {**_encode_body("r8_local_part_1", IMAGES[:1], receiver.port), "modality": "AUDIO"}
    with qwen_server.client() as client:
        response = client.post("/encode", json=body)
    assert response.status_code == 400, response.text
    answer = response.json()
    assert answer["status"] == "error" and "modality" in answer["message"]
    assert "Traceback" not in answer["message"]
    [message] = receiver.messages()
    assert message["req_id"] == "r8_local_part_1" and message["error_msg"] == answer["message"]


def test_registrations_must_agree_on_receive_count(qwen_server: LiveServer) -> None:
    body = {"req_id": "r9_local_part_0", "receive_count": 2, "receive_url": "127.0.0.1:5555", "modality": "IMAGE"}
    with qwen_server.client() as client:
        assert client.post("/scheduler_receive_url", json=body).status_code == 200
        response = client.post("/scheduler_receive_url", json={**body, "receive_count": 3})
        malformed = client.post("/scheduler_receive_url", json={**body, "receive_url": "not a host"})
    assert response.status_code == 400
    assert response.json()["status"] == "error" and "inconsistent receive_count" in response.json()["message"]
    assert malformed.status_code == 422 and "receive_url" in malformed.json()["message"]
