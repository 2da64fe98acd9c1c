"""mmencode's output as vLLM 0.34.0 takes it, decoded by vLLM's own code in the peers venv.

``pt``/``npy`` payloads through ``ImageEmbeddingMediaIO`` (what the chat API runs on an
``image_embeds`` content part) and, for every video family, ``VideoEmbeddingMediaIO`` (a ``video_embeds``
part's rows), and ``--ec-shared-storage`` files through ``ECExampleConnector`` in
the consumer role (what a language instance started as ``ec_consumer`` runs).
"""

from __future__ import annotations

import base64
import io
import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from mmencode.app.peers.vllm.ec_storage import EC_LOCK_NAME, EC_USAGE_NAME
from mmencode.app.peers.vllm.ec_writer import EC_CACHE_FILENAME
from mmencode.models import load_encoder
from tests.contract.test_video import FAMILIES as VIDEO_FAMILIES
from tests.helpers import (
    LiveServer,
    assert_error,
    clip,
    data_uri,
    live_server,
    noise_image,
    readme_python,
    rows_of,
    video_data_uri,
)
from tests.peers.run import vllm_decode, vllm_ec_consume

IMAGES = [data_uri(noise_image(56, 56, seed=91)), data_uri(noise_image(112, 56, seed=92))]
# 7 frames at 8 fps: every video family samples 2 frames a second (Qwen's own rate, vLLM's and SGLang's),
# which for this clip is 2 temporal patches; Qwen3-VL and Qwen3.5 give each its timestamp.
VIDEO = {"video": video_data_uri(clip(7, 72, 40, fps=8, seed=93))}
TIMED = {"qwen3_vl", "qwen3_5"}  # their video_embeds part carries timestamps
VIDEO_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _encode(client: Any, **options: Any) -> dict[str, Any]:
    response = client.post("/v1/encode", json={"items": [{"image": image} for image in IMAGES], **options})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


# Every payload kind vLLM's ImageEmbeddingMediaIO takes from mmencode; decoded in one start of the peers venv.
PAYLOADS = [("pt", "bfloat16"), ("pt", "float32"), ("pt", "float16"), ("npy", "float32"), ("npy", "float16")]


def test_vllm_decodes_pt_and_npy_payloads_to_the_exact_rows(qwen_server: LiveServer, tmp_path: Path) -> None:
    with qwen_server.client() as client:
        reference = [rows_of(item) for item in _encode(client)["items"]]  # float32 base64
        encoded = {kind: _encode(client, encoding_format=kind[0], dtype=kind[1])["items"] for kind in PAYLOADS}
    payloads = [item["embedding"]["data"] for items in encoded.values() for item in items]
    decoded = iter(vllm_decode(payloads, tmp_path))
    for (encoding_format, dtype), items in encoded.items():
        want_dtype = getattr(torch, dtype)
        for item, rows in zip(items, reference, strict=True):
            tensor = next(decoded)
            assert item["embedding"]["encoding_format"] == encoding_format
            assert tensor.dtype == want_dtype, (encoding_format, dtype)
            assert list(tensor.shape) == item["embedding"]["shape"] == [item["num_tokens"], 64]
            assert torch.equal(tensor, rows.to(want_dtype)), (encoding_format, dtype)


@dataclass
class VideoServer:
    family: str
    server: LiveServer
    width: int  # the language model's hidden size, times 1 + the DeepStack levels on Qwen3-VL
    merge_size: int


@pytest.fixture(scope="module", params=VIDEO_FAMILIES)
def video_server(
    request: pytest.FixtureRequest, tiny_checkpoint: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VideoServer]:
    checkpoint = tiny_checkpoint(request.param, layout="servable")  # as tests/contract/test_video.py builds them
    config = json.loads((checkpoint / "config.json").read_text())
    levels = len(config["vision_config"].get("deepstack_visual_indexes") or [])
    width = config["text_config"]["hidden_size"] * (1 + levels)
    merge_size = config["vision_config"]["spatial_merge_size"]
    with live_server(model=checkpoint, cache_dir=tmp_path_factory.mktemp("cache")) as server:
        yield VideoServer(request.param, server, width, merge_size)


def _assert_video_item(video: VideoServer, item: dict[str, Any]) -> None:
    """The rows' shape as vLLM's Qwen2-VL field factory slices them: ``prod(grid) / merge_size**2`` rows
    per clip (it re-slices by the grid and checks no count), each the model's full width."""
    grid = item["metadata"]["video_grid_thw"]
    assert grid[0] == 2
    assert item["num_tokens"] == math.prod(grid) // video.merge_size**2
    assert item["embedding"]["shape"] == [item["num_tokens"], video.width]
    if video.family == "qwen3_vl":  # [main | DeepStack level 0 | level 1] side by side
        assert sum(item["metadata"]["deepstack_split"]) == video.width > item["metadata"]["deepstack_split"][0]


def test_vllm_decodes_a_video_items_pt_payload_to_the_exact_rows(video_server: VideoServer, tmp_path: Path) -> None:
    """A clip's rows as a ``video_embeds`` part carries them, read by vLLM's VideoEmbeddingMediaIO, in
    float32 and bfloat16, for every video family."""
    with video_server.server.client() as client:
        reference = rows_of(client.post("/v1/encode", json={"items": [VIDEO]}).json()["items"][0])
        encoded = []
        for name in VIDEO_DTYPES:
            response = client.post("/v1/encode", json={"items": [VIDEO], "encoding_format": "pt", "dtype": name})
            assert response.status_code == 200, response.text
            encoded.append(response.json()["items"][0])
    decoded = vllm_decode([item["embedding"]["data"] for item in encoded], tmp_path, modality="video")
    for item, tensor, dtype in zip(encoded, decoded, VIDEO_DTYPES.values(), strict=True):
        _assert_video_item(video_server, item)
        assert list(tensor.shape) == item["embedding"]["shape"] and tensor.dtype == dtype
        assert torch.equal(tensor, reference.to(dtype))


def test_a_pt_payload_holds_only_its_own_rows(qwen_server: LiveServer) -> None:
    # Two images in one batch: a view into the batch output would torch.save both items' rows.
    with qwen_server.client() as client:
        items = _encode(client, encoding_format="pt", dtype="bfloat16")["items"]
    for item in items:
        tensor = torch.load(io.BytesIO(base64.b64decode(item["embedding"]["data"])), weights_only=True)
        rows, width = item["embedding"]["shape"]
        assert tensor.is_contiguous() and tensor.storage_offset() == 0
        assert tensor.untyped_storage().nbytes() == rows * width * 2


def test_npy_with_bfloat16_is_refused_in_the_error_shape(qwen_server: LiveServer) -> None:
    with qwen_server.client() as client:
        response = client.post(
            "/v1/encode", json={"items": [{"image": IMAGES[0]}], "encoding_format": "npy", "dtype": "bfloat16"}
        )
        error = assert_error(response, 422, "validation_error")
        assert "bfloat16" in error["message"]
        form = client.post(
            "/v1/encode",
            files={"image": ("a.png", base64.b64decode(IMAGES[0].split(",", 1)[1]))},
            data={"encoding_format": "npy", "dtype": "bfloat16"},
        )
        assert_error(form, 422, "validation_error")


def test_the_hash_differs_with_the_compute_dtype(checkpoints: dict[str, Path]) -> None:
    # The hash is vLLM's uuid: bf16 and fp32 towers give different rows, so they must not share it.
    cpu = torch.device("cpu")
    fp32 = load_encoder(checkpoints["qwen2_vl"], device=cpu, dtype=torch.float32)
    bf16 = load_encoder(checkpoints["qwen2_vl"], device=cpu, dtype=torch.bfloat16)
    again = load_encoder(checkpoints["qwen2_vl"], device=cpu, dtype=torch.float32)
    assert fp32.fingerprint != bf16.fingerprint
    assert fp32.fingerprint == again.fingerprint


@pytest.fixture(scope="module")
def ec_server(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    storage = tmp_path_factory.mktemp("ec")
    with live_server(
        model=checkpoints["qwen2_vl"],
        cache_dir=tmp_path_factory.mktemp("cache"),
        ec_shared_storage=storage,
        ec_dtype="bfloat16",  # a GPU language model's dtype; the default follows the encoder (float32 here)
    ) as server:
        yield server


def test_vllm_ec_consumer_loads_every_item_mmencode_wrote(ec_server: LiveServer, tmp_path: Path) -> None:
    storage = ec_server.settings.ec_shared_storage
    assert storage is not None
    with ec_server.client() as client:
        first = _encode(client)
        written = {p: (p.stat().st_ino, p.read_bytes()) for p in storage.rglob(EC_CACHE_FILENAME)}
        # The same first image again (from the cache) and one only named by its hash.
        again = client.post(
            "/v1/encode",
            json={"items": [{"image": IMAGES[0]}, {"hash": first["items"][1]["hash"]}], "dtype": "bfloat16"},
        ).json()
    assert [item["source"] for item in first["items"]] == ["encoder", "encoder"]
    assert [item["source"] for item in again["items"]] == ["cache", "cache"]
    hashes = [item["hash"] for item in first["items"]]
    for body in (first, again):
        for item, item_hash in zip(body["items"], hashes, strict=True):
            # The response says where the item went, and the file is there before the answer.
            assert item["ec_cache_path"] == str(storage / item_hash / EC_CACHE_FILENAME)
            assert Path(item["ec_cache_path"]).is_file()
    # Files already there are not written again (the same inode, the same bytes; naming one again only
    # touches it, so that --ec-min-age counts from the last answer that named it); atomic writes leave no
    # temporary files behind, only the budget's own lock and usage files beside the items' folders.
    assert {p: (p.stat().st_ino, p.read_bytes()) for p in storage.rglob(EC_CACHE_FILENAME)} == written
    files = sorted(p.relative_to(storage).name for p in storage.rglob("*") if p.is_file())
    assert files == [EC_LOCK_NAME, EC_USAGE_NAME, EC_CACHE_FILENAME, EC_CACHE_FILENAME]

    consumed = vllm_ec_consume(storage, [*hashes, "0" * 32], tmp_path)
    assert consumed["found"] == {hashes[0]: True, hashes[1]: True, "0" * 32: False}
    assert set(consumed["loaded"]) == set(hashes)
    for item, item_hash in zip(first["items"], hashes, strict=True):
        loaded = consumed["loaded"][item_hash]
        assert loaded.dtype == torch.bfloat16
        assert torch.equal(loaded, rows_of(item).to(torch.bfloat16))


def test_vllm_ec_consumer_loads_a_video_item_mmencode_wrote(ec_server: LiveServer, tmp_path: Path) -> None:
    """A clip's rows go through the connector as an image's do: one file under the item's hash."""
    storage = ec_server.settings.ec_shared_storage
    assert storage is not None
    with ec_server.client() as client:
        response = client.post(
            "/v1/encode",
            json={"items": [{"video": video_data_uri(clip(7, 72, 40, fps=8, seed=94)), "fps": 4}], "dtype": "bfloat16"},
        )
    assert response.status_code == 200, response.text
    item = response.json()["items"][0]
    assert item["ec_cache_path"] == str(storage / item["hash"] / EC_CACHE_FILENAME)
    consumed = vllm_ec_consume(storage, [item["hash"]], tmp_path)
    assert consumed["found"] == {item["hash"]: True}
    loaded = consumed["loaded"][item["hash"]]
    assert list(loaded.shape) == [item["num_tokens"], 64]
    assert torch.equal(loaded, rows_of(item).to(torch.bfloat16))


def test_an_unwritable_ec_storage_never_fails_the_request(
    checkpoints: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("")
    with (
        live_server(model=checkpoints["qwen2_vl"], cache_dir=tmp_path / "c", ec_shared_storage=not_a_dir) as server,
        server.client() as client,
    ):
        body = _encode(client)
        assert [item["ec_cache_path"] for item in body["items"]] == [None, None]
        metrics = client.get("/metrics").text
    assert re.search(r'mmencode_ec_cache_writes_total\{result="error"\} 2\.0', metrics), metrics
    assert "could not write the encoder cache" in caplog.text


def test_readme_vllm_example_builds_content_parts_vllm_decodes(
    qwen_server: LiveServer, internvl_server: LiveServer, tmp_path: Path
) -> None:
    readme = readme_python("Use with vLLM")  # the documented client code
    with qwen_server.client() as client:
        body = _encode(client, encoding_format="pt", dtype="bfloat16")
        reference = [rows_of(item) for item in _encode(client)["items"]]
    parts = readme["to_vllm_content_parts"](body)
    assert readme["encode_for_vllm"](qwen_server.url, IMAGES) == parts
    for part, item in zip(parts, body["items"], strict=True):
        assert part["type"] == "image_embeds" and part["uuid"] == item["hash"]
        # A flat [t, h, w]: vLLM refuses a nested grid.
        assert part["image_embeds"]["image_grid_thw"] == item["metadata"]["image_grid_thw"]
        assert all(isinstance(n, int) for n in part["image_embeds"]["image_grid_thw"])
    # A family without a grid (InternVL): the tensor alone.
    with internvl_server.client() as client:
        plain_body = _encode(client, encoding_format="pt", dtype="bfloat16")
        plain_reference = [rows_of(item) for item in _encode(client)["items"]]
    plain = readme["to_vllm_content_parts"](plain_body)
    assert all(isinstance(part["image_embeds"], str) for part in plain)
    decoded = vllm_decode(
        [p["image_embeds"]["image_embeds"] for p in parts] + [p["image_embeds"] for p in plain], tmp_path
    )
    for tensor, rows in zip(decoded, reference + plain_reference, strict=True):
        assert torch.equal(tensor, rows.to(torch.bfloat16))


def test_readme_vllm_example_builds_a_video_embeds_part_vllm_decodes(video_server: VideoServer, tmp_path: Path) -> None:
    """A clip and an image in one answer, per video family, in float32 and bfloat16: the README's code gives
    a ``video_embeds`` part (rows, grid, and timestamps on Qwen3-VL and Qwen3.5) beside an ``image_embeds``
    one; vLLM's own readers give back the exact rows of each."""
    readme = readme_python("Use with vLLM")
    items = [VIDEO, {"image": IMAGES[0]}]
    with video_server.server.client() as client:
        reference = [rows_of(i) for i in client.post("/v1/encode", json={"items": items}).json()["items"]]
        bodies = [
            client.post("/v1/encode", json={"items": items, "encoding_format": "pt", "dtype": name}).json()
            for name in VIDEO_DTYPES
        ]
    payloads = []
    for body in bodies:
        clip_item = body["items"][0]
        _assert_video_item(video_server, clip_item)
        video, image = readme["to_vllm_content_parts"](body)
        assert video["type"] == "video_embeds" and video["uuid"] == clip_item["hash"]
        timed = video_server.family in TIMED
        assert set(video["video_embeds"]) == {"video_embeds", "video_grid_thw"} | ({"timestamps"} if timed else set())
        grid = video["video_embeds"]["video_grid_thw"]
        assert grid == clip_item["metadata"]["video_grid_thw"] and all(isinstance(n, int) for n in grid)
        if timed:  # one per temporal patch: vLLM writes each patch's "<t seconds>" from them
            assert video["video_embeds"]["timestamps"] == clip_item["metadata"]["timestamps"]
            assert len(video["video_embeds"]["timestamps"]) == grid[0]
        # Qwen2.5-VL: the metadata has second_per_grid_ts, the part does not (vLLM 0.32 drops it; README).
        assert ("second_per_grid_ts" in clip_item["metadata"]) == (video_server.family == "qwen2_5_vl")
        assert image["type"] == "image_embeds"
        assert image["image_embeds"]["image_grid_thw"] == body["items"][1]["metadata"]["image_grid_thw"]
        payloads += [video["video_embeds"]["video_embeds"], image["image_embeds"]["image_embeds"]]
    decoded = vllm_decode(payloads, tmp_path, modality=["video", "image"] * len(bodies))
    pairs = zip(decoded[::2], decoded[1::2], strict=True)
    for (clip_rows, image_rows), dtype in zip(pairs, VIDEO_DTYPES.values(), strict=True):
        assert clip_rows.dtype == image_rows.dtype == dtype
        assert torch.equal(clip_rows, reference[0].to(dtype))
        assert torch.equal(image_rows, reference[1].to(dtype))
