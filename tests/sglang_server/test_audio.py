"""Audio through SGLang's split with mmencode as the encoder: Qwen2-Audio.

SGLang's own encoder is no reference here: it decodes audio with torchaudio, which has no release that loads
beside torch 2.13, and its Qwen2-Audio encoder has two bugs of its own (it sizes the rows by the audio tower's
width, not the projector's, ``disaggregation/encoder/server.py:921-957``; and runs the tower without the
padding mask, ``srt/models/qwen2_audio.py:112``, so a clip shorter than the 30 s window gets other rows than
transformers' and vLLM's). What is checked: SGLang places every row mmencode sends (the prompt holds the
clip's rows), answers with them, and another clip moves the answer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from bench.peers.sglang.server import SGLangServer, chat, dispatched_items, register, sglang_server
from mmencode.models.tiny import build_tiny
from tests.helpers import audio_data_uri, mmencode_process, plain_mmencode, tone, wav

RATE = 16_000


def _part(seconds: float, seed: int) -> dict[str, Any]:
    return {"type": "audio_url", "audio_url": {"url": audio_data_uri(wav(tone(seconds, RATE, seed=seed), RATE))}}


@pytest.fixture(scope="module")
def audio_split(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SGLangServer, str]]:
    root = tmp_path_factory.mktemp("sglang-audio")
    checkpoint = build_tiny(root / "model", "qwen2_audio", layout="servable")
    servers = [
        sglang_server(checkpoint, root / "language.log", role="language"),
        mmencode_process(plain_mmencode(), "--model", str(checkpoint), log=root / "mmencode.log"),
    ]
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(max_workers=2) as starter:
        language, mmencode = (f.result() for f in [starter.submit(stack.enter_context, s) for s in servers])
        yield language, mmencode


def test_sglang_answers_from_mmencodes_audio_rows(audio_split: tuple[SGLangServer, str]) -> None:
    language, mmencode = audio_split
    register(language, mmencode)
    clip = _part(1.5, seed=601)
    rows = httpx.post(mmencode + "/v1/encode", json={"items": [{"audio": clip["audio_url"]["url"]}]}, timeout=60)
    num_tokens = rows.json()["items"][0]["num_tokens"]
    text = chat(language, [{"type": "text", "text": "."}])  # the same prompt without the clip
    before = dispatched_items(language)
    answer = chat(language, [clip])
    assert dispatched_items(language) > before
    # The clip's rows, and "Audio 1: " with its two markers, on top of the text-only prompt.
    assert answer.prompt_tokens - text.prompt_tokens >= num_tokens
    assert chat(language, [_part(1.5, seed=602)]).moved_from(answer)
