"""Audio items as the peers take them, decoded by their own code in the peers venv: vLLM's
``AudioEmbeddingMediaIO`` (an ``audio_embeds`` content part), its ``ECExampleConnector`` (the
encoder-cache files), and SGLang 0.5.23's receiver (an ``AUDIO`` part of its encoder protocol)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from mmencode.app.peers.vllm.ec_writer import EC_CACHE_FILENAME
from tests.helpers import LiveServer, audio_data_uri, encoded, live_server, readme_python, rows_of, tone, wav
from tests.peers.run import SGLangReceiver, vllm_decode, vllm_ec_consume

RATE = 16_000
CLIPS = [
    audio_data_uri(wav(tone(1.3, RATE, 1, seed=61), RATE)),
    audio_data_uri(encoded(tone(3.7, RATE, 2, seed=62), RATE, "flac", "flac"), "flac"),
]


# Rows per clip: Qwen2-Audio and Qwen2.5-Omni pool the 30 s window's tower output by two; Qwen3-Omni's
# tower works in chunks of 100 mel frames, 13 rows each, plus the rest's (docs/api.md, "Audio items").
ROWS = {"qwen2_audio": [32, 92], "qwen2_5_omni": [32, 92], "qwen3_omni_moe": [17, 48]}


@pytest.fixture(scope="module", params=sorted(ROWS))
def audio_server(
    request: pytest.FixtureRequest, tiny_checkpoint: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    with live_server(
        model=tiny_checkpoint(request.param),
        cache_dir=tmp_path_factory.mktemp("cache"),
        ec_shared_storage=tmp_path_factory.mktemp("ec"),
        ec_dtype="bfloat16",
    ) as server:
        yield server


def _items(server: LiveServer, **options: Any) -> list[dict[str, Any]]:
    with server.client() as client:
        response = client.post("/v1/encode", json={"items": [{"audio": c} for c in CLIPS], **options})
    assert response.status_code == 200, response.text
    return list(response.json()["items"])


# The payload and the connector file do not depend on the family: one family's rows are enough there.
@pytest.mark.parametrize("audio_server", ["qwen2_audio"], indirect=True)
def test_vllm_decodes_audio_pt_payloads_to_the_exact_rows(audio_server: LiveServer, tmp_path: Path) -> None:
    reference = [rows_of(item) for item in _items(audio_server)]
    dtypes = ("float32", "bfloat16")  # decoded in one start of the peers venv
    items = [item for dtype in dtypes for item in _items(audio_server, encoding_format="pt", dtype=dtype)]
    decoded = vllm_decode([item["embedding"]["data"] for item in items], tmp_path, modality="audio")
    expected = [(dtype, rows) for dtype in dtypes for rows in reference]
    for item, (dtype, rows), tensor in zip(items, expected, decoded, strict=True):
        # 2-D (num_tokens, hidden): what vLLM's Qwen2-Audio processor requires of audio_embeds.
        assert list(tensor.shape) == [item["num_tokens"], rows.shape[1]] and tensor.dtype == getattr(torch, dtype)
        assert torch.equal(tensor, rows.to(tensor.dtype))


def test_readme_vllm_example_builds_audio_embeds_parts_vllm_decodes(audio_server: LiveServer, tmp_path: Path) -> None:
    """Every audio family's metadata makes the README's code build ``audio_embeds`` parts vLLM decodes."""
    parts = readme_python("Use with vLLM")["to_vllm_content_parts"](
        {"items": _items(audio_server, encoding_format="pt", dtype="bfloat16")}
    )
    reference = [rows_of(item) for item in _items(audio_server)]
    assert [part["type"] for part in parts] == ["audio_embeds", "audio_embeds"]
    decoded = vllm_decode([part["audio_embeds"] for part in parts], tmp_path, modality="audio")
    for tensor, rows in zip(decoded, reference, strict=True):
        assert torch.equal(tensor, rows.to(torch.bfloat16))


@pytest.mark.parametrize("audio_server", ["qwen2_audio"], indirect=True)
def test_vllm_ec_consumer_loads_audio_items_mmencode_wrote(audio_server: LiveServer, tmp_path: Path) -> None:
    storage = audio_server.settings.ec_shared_storage
    assert storage is not None
    items = _items(audio_server)
    hashes = [item["hash"] for item in items]
    for item in items:
        assert item["ec_cache_path"] == str(storage / item["hash"] / EC_CACHE_FILENAME)
    consumed = vllm_ec_consume(storage, hashes, tmp_path)
    assert consumed["found"] == dict.fromkeys(hashes, True)
    for item in items:
        assert torch.equal(consumed["loaded"][item["hash"]], rows_of(item).to(torch.bfloat16))


def test_an_audio_part_reaches_sglang_with_its_modality_and_feature_lengths(
    audio_server: LiveServer, tmp_path: Path
) -> None:
    """Two clips as one AUDIO part: the rows, Modality.AUDIO, and each clip's mel frame count as
    ``grid_dim`` (a LongTensor, SGLang's ``audio_feature_lens_raw``), as SGLang's own encoder sends them."""
    items = _items(audio_server)
    receiver = SGLangReceiver(tmp_path, count=1)
    try:
        body = {
            "encoder_idx": 0,
            "encoder_url": "http://mmencode",
            "mm_items": CLIPS,
            "num_parts": 1,
            "part_idx": 0,
            "req_id": "a1_local_part_0",
            "modality": "AUDIO",
            "prefill_host": "127.0.0.1",
            "embedding_port": receiver.port,
        }
        with audio_server.client() as client:
            response = client.post("/encode", json=body)
        assert response.status_code == 200, response.text
        [message] = receiver.messages()
    finally:
        receiver.close()
    assert message["is_sglang_class"] and message["error_msg"] is None
    assert message["modality"] == "sglang.srt.multimodal.modality.<Modality.AUDIO: 3>"
    assert torch.equal(message["embedding"], torch.cat([rows_of(i) for i in items]))  # float32: the encoder's
    assert message["grid_is_tensor"] and message["grid"].dtype == torch.long
    assert message["grid"].tolist() == [i["metadata"]["audio_feature_length"] for i in items] == [130, 370]
    assert [i["num_tokens"] for i in items] == ROWS[audio_server.settings.model.name]
