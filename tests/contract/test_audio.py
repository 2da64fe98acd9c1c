"""Audio items over HTTP, against the family's own transformers processor and model.

Tiny Qwen2-Audio, Qwen2.5-Omni and Qwen3-Omni checkpoints (the Omni ones also as released, with their
speech output). The reference is the whole transformers model run on the
family's whole processor (its feature extractor, a tokenizer knowing its audio tokens): the placeholder
count is the processor's, and the rows are the ones the model scatters into ``inputs_embeds`` at the
placeholders (captured on the way into its language model). Both are given the samples a decoder hands
over for the file (16-bit PCM ``x / 32768``, channels averaged). fp32 on CPU.
"""

from __future__ import annotations

import base64
import functools
import io
import json
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import (
    Qwen2_5OmniConfig,
    Qwen2_5OmniProcessor,
    Qwen2_5OmniThinkerForConditionalGeneration,
    Qwen2AudioForConditionalGeneration,
    Qwen2AudioProcessor,
    Qwen2VLImageProcessorPil,
    Qwen3OmniMoeConfig,
    Qwen3OmniMoeProcessor,
    Qwen3OmniMoeThinkerForConditionalGeneration,
    WhisperFeatureExtractor,
)

from mmencode.models import load_encoder
from mmencode.models.tiny import FAMILIES as TINY_BUILDERS
from mmencode.models.tiny import build_tiny
from mmencode.models.tiny.audio import qwen2_5_omni, qwen3_omni_moe
from tests.families.common import tiny_tokenizer
from tests.helpers import (
    as_float,
    asgi_client,
    assert_error,
    audio_data_uri,
    bare_base64,
    clip,
    data_uri,
    encoded,
    file_server,
    image_bytes,
    noise_image,
    precomputed,
    rows_of,
    tone,
    video_data_uri,
    wav,
)

ATOL = 1e-5
FAMILIES = ["qwen2_audio", "qwen2_5_omni", "qwen3_omni_moe"]
RATE = 16_000
# Two clips of different length and layout: 1.31 s mono wav (131 mel frames: an odd count, which the
# tower's stride-2 steps round); 3.7 s stereo flac of an odd sample count.
CLIPS = {
    "wav": (tone(1.31, RATE, 1, seed=1), "wav"),
    "flac": (tone(3.7, RATE, 2, seed=2)[:-1], "flac"),
}


def file_of(samples: np.ndarray, kind: str, rate: int = RATE) -> bytes:
    return wav(samples, rate) if kind == "wav" else encoded(samples, rate, kind, kind)


@pytest.fixture(scope="module", params=FAMILIES)
def checkpoint(request: pytest.FixtureRequest, tiny_checkpoint: Callable[..., Path]) -> Path:
    return tiny_checkpoint(request.param)


@pytest.fixture(scope="module")
async def client(checkpoint: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(model=checkpoint, cache_bytes=0) as client:
        yield client


@pytest.fixture(scope="module")
def reference(checkpoint: Path) -> Callable[[list[np.ndarray]], list[dict[str, Any]]]:
    """What transformers makes of clips (float samples at 16 kHz): per clip, the placeholder count, the
    metadata and the rows the model scatters at the placeholders."""
    features = WhisperFeatureExtractor.from_pretrained(checkpoint)
    captured: dict[str, torch.Tensor] = {}

    def capture(module: torch.nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        captured["embeds"] = kwargs["inputs_embeds"]

    if checkpoint.name.startswith("qwen2_audio"):
        tokens = tiny_tokenizer(
            audio_token="<|AUDIO|>", audio_bos_token="<|audio_bos|>", audio_eos_token="<|audio_eos|>"
        )
        processor: Any = Qwen2AudioProcessor(feature_extractor=features, tokenizer=tokens)
        model: Any = Qwen2AudioForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32).eval()
        model.model.language_model.register_forward_pre_hook(capture, with_kwargs=True)
        text = "<|audio_bos|> <|AUDIO|> <|audio_eos|>"
    elif checkpoint.name.startswith("qwen3_omni_moe"):
        from transformers import Qwen2VLVideoProcessor  # torchvision: the main environment has it

        tokens = tiny_tokenizer(
            audio_token="<|audio_pad|>",
            audio_bos_token="<|audio_start|>",
            audio_eos_token="<|audio_end|>",
            image_token="<|image_pad|>",
            video_token="<|video_pad|>",
            vision_bos_token="<|vision_start|>",
            vision_eos_token="<|vision_end|>",
        )
        processor = Qwen3OmniMoeProcessor(
            image_processor=Qwen2VLImageProcessorPil(),
            video_processor=Qwen2VLVideoProcessor(),
            feature_extractor=features,
            tokenizer=tokens,
        )
        config = Qwen3OmniMoeConfig.from_pretrained(checkpoint).thinker_config
        model = Qwen3OmniMoeThinkerForConditionalGeneration.from_pretrained(
            checkpoint, config=config, dtype=torch.float32
        ).eval()
        model.model.language_model.register_forward_pre_hook(capture, with_kwargs=True)
        text = "<|audio_start|> <|audio_pad|> <|audio_end|>"
    else:
        tokens = tiny_tokenizer(
            audio_token="<|AUDIO|>",
            audio_bos_token="<|audio_bos|>",
            audio_eos_token="<|audio_eos|>",
            image_token="<|IMAGE|>",
            video_token="<|VIDEO|>",
            vision_bos_token="<|vision_bos|>",
            vision_eos_token="<|vision_eos|>",
        )
        from transformers import Qwen2VLVideoProcessor  # torchvision: the main environment has it

        processor = Qwen2_5OmniProcessor(
            image_processor=Qwen2VLImageProcessorPil(),
            video_processor=Qwen2VLVideoProcessor(),
            feature_extractor=features,
            tokenizer=tokens,
        )
        # The thinker alone: the language side that splices the audio tower's rows.
        config = Qwen2_5OmniConfig.from_pretrained(checkpoint).thinker_config
        model = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(
            checkpoint, config=config, dtype=torch.float32
        ).eval()
        model.model.language_model.register_forward_pre_hook(capture, with_kwargs=True)
        text = "<|audio_bos|> <|AUDIO|> <|audio_eos|>"
    audio_token = tokens.convert_tokens_to_ids(text.split()[1])

    def run(clips: list[np.ndarray]) -> list[dict[str, Any]]:
        out = processor(text=[text] * len(clips), audio=clips, sampling_rate=RATE, return_tensors="pt", padding=True)
        placeholders = out["input_ids"] == audio_token
        with torch.no_grad():
            model(**out)
        counts = placeholders.sum(-1).tolist()
        rows = captured["embeds"][placeholders].split(counts)
        lengths = out["feature_attention_mask"].sum(-1).tolist()
        return [
            {"num_tokens": n, "metadata": {"audio_feature_length": length}, "rows": r}
            for n, length, r in zip(counts, lengths, rows, strict=True)
        ]

    return run


async def encode(client: httpx.AsyncClient, *items: dict[str, Any], **options: Any) -> list[dict[str, Any]]:
    response = await client.post("/v1/encode", json={"items": list(items), **options})
    assert response.status_code == 200, response.text
    return list(response.json()["items"])


@pytest.mark.parametrize("name", sorted(CLIPS))
async def test_a_clip_gives_the_processors_count_metadata_and_the_models_rows(
    client: httpx.AsyncClient, reference: Callable[..., list[dict[str, Any]]], name: str
) -> None:
    samples, kind = CLIPS[name]
    [item] = await encode(client, {"audio": audio_data_uri(file_of(samples, kind), kind)})
    [want] = reference([as_float(samples)])
    assert item["num_tokens"] == want["num_tokens"] == rows_of(item).shape[0]
    assert item["metadata"] == want["metadata"]
    if name == "wav":
        assert item["metadata"]["audio_feature_length"] == 131  # odd: the tower's rounding is exercised
    torch.testing.assert_close(rows_of(item), want["rows"], atol=ATOL, rtol=0)


async def test_two_clips_in_one_request_equal_two_single_requests(
    client: httpx.AsyncClient, reference: Callable[..., list[dict[str, Any]]]
) -> None:
    files = [audio_data_uri(file_of(samples, kind), kind) for samples, kind in CLIPS.values()]
    both = await encode(client, *({"audio": f} for f in files))
    singles = [(await encode(client, {"audio": f}))[0] for f in files]
    # Each clip's features alone: transformers' Qwen3-Omni itself moves a short clip's rows by 1.07e-5 when it
    # shares a padded batch with a longer one (measured); the model's features of a clip are its own.
    wanted = [reference([as_float(samples)])[0] for samples, _ in CLIPS.values()]
    for pair, single, want in zip(both, singles, wanted, strict=True):
        assert pair["num_tokens"] == single["num_tokens"] == want["num_tokens"]
        torch.testing.assert_close(rows_of(pair), rows_of(single), atol=ATOL, rtol=0)
        torch.testing.assert_close(rows_of(pair), want["rows"], atol=ATOL, rtol=0)


async def test_multipart_mp3_and_a_resampled_clip(client: httpx.AsyncClient) -> None:
    """An mp3 upload as a file part; a 44.1 kHz clip is resampled: rows for its length at 16 kHz."""
    mp3 = encoded(tone(2.0, RATE, 1, seed=3), RATE, "mp3", "libmp3lame")
    response = await client.post(
        "/v1/encode",
        data={"request": '{"items": [{}]}'},
        files={"items[0].audio": ("clip.mp3", mp3, "audio/mpeg")},
    )
    assert response.status_code == 200, response.text
    uploaded = response.json()["items"][0]
    assert uploaded["metadata"] == {"audio_feature_length": 200}  # 2 s: 100 frames a second
    [item] = await encode(client, {"audio": audio_data_uri(wav(tone(2.0, 44_100, 1), 44_100))})
    assert item["metadata"] == {"audio_feature_length": 200}
    assert item["num_tokens"] == uploaded["num_tokens"] == rows_of(item).shape[0]


async def test_an_ogg_clip_by_url_equals_the_same_bytes_inline(
    tiny_checkpoint: Callable[..., Path], tmp_path: Path
) -> None:
    """Opus in Ogg fetched from an http URL (``audio/ogg``): the same item as its data URI."""
    data = encoded(tone(1.5, RATE, 1, seed=5), RATE, "ogg", "libopus")
    (tmp_path / "clip.ogg").write_bytes(data)
    with file_server(tmp_path) as base:
        async with asgi_client(
            model=tiny_checkpoint("qwen2_audio"), cache_bytes=0, allowed_url_hosts=["127.0.0.1"]
        ) as client:
            by_url, inline = await encode(client, {"audio": f"{base}/clip.ogg"}, {"audio": audio_data_uri(data, "ogg")})
    assert by_url["hash"] == inline["hash"] and by_url["metadata"] == inline["metadata"]
    assert abs(by_url["metadata"]["audio_feature_length"] - 150) <= 2  # 1.5 s; Opus pads its first frame
    torch.testing.assert_close(rows_of(by_url), rows_of(inline), atol=0, rtol=0)


async def test_precomputed_audio_is_checked_against_its_metadata(client: httpx.AsyncClient) -> None:
    samples, kind = CLIPS["wav"]
    [item] = await encode(client, {"audio": audio_data_uri(file_of(samples, kind), kind)})
    rows = rows_of(item)
    given = {"precomputed_embedding": precomputed(rows), "modality": "audio", "metadata": item["metadata"]}
    [back] = await encode(client, given)
    assert back["source"] == "precomputed"
    torch.testing.assert_close(rows_of(back), rows, atol=0, rtol=0)
    missing = await client.post("/v1/encode", json={"items": [{**given, "metadata": {}}]})
    error = assert_error(missing, 400, "missing_metadata")
    assert error["details"]["required"] == ["audio_feature_length"]
    wrong = {**given, "metadata": {"audio_feature_length": item["metadata"]["audio_feature_length"] + 40}}
    assert_error(await client.post("/v1/encode", json={"items": [wrong]}), 400, "precomputed_shape_mismatch")


async def test_embeddings_pool_a_clip_into_one_vector(client: httpx.AsyncClient) -> None:
    samples, kind = CLIPS["wav"]
    uri = audio_data_uri(file_of(samples, kind), kind)
    [item] = await encode(client, {"audio": uri})
    model = (await client.get("/v1/models")).json()["data"][0]["id"]
    response = await client.post("/v1/embeddings", json={"model": model, "input": [uri]})
    assert response.status_code == 200, response.text
    vector = torch.tensor(response.json()["data"][0]["embedding"])
    mean = rows_of(item).mean(dim=0)
    torch.testing.assert_close(vector, mean / mean.norm(), atol=1e-5, rtol=0)


async def test_pt_payload_is_the_rows_as_torch_saves_them(client: httpx.AsyncClient) -> None:
    """``pt``: what vLLM's ``audio_embeds`` part carries (base64 of ``torch.save`` of the 2-D rows)."""
    samples, kind = CLIPS["wav"]
    uri = audio_data_uri(file_of(samples, kind), kind)
    [plain] = await encode(client, {"audio": uri})
    [item] = await encode(client, {"audio": uri}, encoding_format="pt")
    tensor = torch.load(io.BytesIO(base64.b64decode(item["embedding"]["data"])), weights_only=True)
    assert tensor.shape == (plain["num_tokens"], rows_of(plain).shape[1])
    torch.testing.assert_close(tensor, rows_of(plain), atol=0, rtol=0)


def _hostile() -> dict[str, tuple[bytes, int, str]]:
    whole = wav(tone(2.0, RATE), RATE)
    ten_hours = bytearray(wav(tone(0.5, RATE), RATE))
    ten_hours[40:44] = (10 * 3600 * RATE * 2).to_bytes(4, "little")  # the data chunk's declared size
    return {
        "truncated wav": (whole[: len(whole) // 3], 400, "invalid_audio"),
        "zero-sample wav": (wav(np.zeros((0, 1), np.int16), RATE), 400, "invalid_audio"),
        "ten-hour header": (bytes(ten_hours), 413, "payload_too_large"),
        "48 kHz 8-channel wav": (wav(tone(1.0, 48_000, 8), 48_000), 400, "invalid_audio"),
        "image as audio": (image_bytes(noise_image(32, 32)), 400, "invalid_audio"),
        "video as audio": (clip(6, 32, 32, fps=4), 400, "invalid_audio"),
        "over the window": (wav(tone(31.0, RATE), RATE), 413, "payload_too_large"),
        "not audio at all": (b"RIFF\x00\x00\x00\x00WAVEjunk" * 8, 400, "invalid_audio"),
    }


HOSTILE = _hostile()


@pytest.mark.parametrize("name", sorted(HOSTILE))
async def test_hostile_audio_is_refused_and_the_worker_serves_on(client: httpx.AsyncClient, name: str) -> None:
    data, status, code = HOSTILE[name]
    item = {"audio": audio_data_uri(data)}
    error = assert_error(await client.post("/v1/encode", json={"items": [item]}), status, code)
    assert error["param"] == "items[0].audio"
    samples, kind = CLIPS["wav"]
    assert (await encode(client, {"audio": audio_data_uri(file_of(samples, kind), kind)}))[0]["num_tokens"] > 0


async def test_an_audio_file_over_the_byte_limit_is_refused_before_decoding(
    tiny_checkpoint: Callable[..., Path],
) -> None:
    samples, kind = CLIPS["wav"]
    data = file_of(samples, kind)
    async with asgi_client(model=tiny_checkpoint("qwen2_audio"), cache_bytes=0, max_audio_bytes=len(data) - 1) as small:
        response = await small.post("/v1/encode", json={"items": [{"audio": audio_data_uri(data, kind)}]})
        error = assert_error(response, 413, "payload_too_large")
        assert error["details"]["limit"] == "max_audio_bytes" and error["param"] == "items[0].audio"
        uploaded = await small.post(
            "/v1/encode", data={"request": '{"items": [{}]}'}, files={"items[0].audio": ("a.wav", data, "audio/wav")}
        )
        assert assert_error(uploaded, 413, "payload_too_large")["details"]["limit"] == "max_audio_bytes"


async def test_an_image_for_an_audio_model_and_audio_for_an_image_model_are_refused(
    client: httpx.AsyncClient, tiny_checkpoint: Callable[..., Path]
) -> None:
    image = {"image": data_uri(noise_image(56, 56))}
    error = assert_error(await client.post("/v1/encode", json={"items": [image]}), 400, "unsupported_modality")
    assert error["param"] == "items[0].image"
    video = {"video": video_data_uri(clip(6, 32, 32, fps=4))}
    error = assert_error(await client.post("/v1/encode", json={"items": [video]}), 400, "unsupported_modality")
    assert error["param"] == "items[0].video" and "takes no video" in error["message"]
    samples, kind = CLIPS["wav"]
    audio = {"audio": audio_data_uri(file_of(samples, kind), kind)}
    async with asgi_client(model=tiny_checkpoint("qwen2_vl"), cache_bytes=0) as vision:
        error = assert_error(await vision.post("/v1/encode", json={"items": [audio]}), 400, "unsupported_modality")
    assert error["param"] == "items[0].audio"
    assert error["details"]["modality"] == "audio"


async def test_embeddings_take_a_bare_base64_clip_with_modality_audio(client: httpx.AsyncClient) -> None:
    """The file's bare base64 (no data URI) with ``"modality": "audio"``: the data URI's pooled vector."""
    samples, kind = CLIPS["wav"]
    data = file_of(samples, kind)
    model = (await client.get("/v1/models")).json()["data"][0]["id"]
    answers = []
    for given in (audio_data_uri(data, kind), bare_base64(data)):
        response = await client.post("/v1/embeddings", json={"model": model, "input": given, "modality": "audio"})
        assert response.status_code == 200, response.text
        answers.append(response.json())
    by_uri, bare = answers
    assert len(bare["data"]) == 1 and bare["usage"] == by_uri["usage"]
    torch.testing.assert_close(
        torch.tensor(bare["data"][0]["embedding"]), torch.tensor(by_uri["data"][0]["embedding"]), atol=0, rtol=0
    )
    # Without the modality a bare base64 string is an image (OpenAI's default): refused, naming the input.
    response = await client.post("/v1/embeddings", json={"model": model, "input": [bare_base64(data)]})
    assert assert_error(response, 400, "unsupported_modality")["param"] == "input[0]"


@pytest.fixture(scope="module")
async def video_client(tiny_checkpoint: Callable[..., Path]) -> AsyncIterator[httpx.AsyncClient]:
    """A video family's service (Qwen2-VL)."""
    async with asgi_client(model=tiny_checkpoint("qwen2_vl"), cache_bytes=0) as client:
        yield client


_SPEECH = tone(1.31, RATE, 1, seed=1)
AUDIO_AS_VIDEO = {
    # (the "video" field, what the message must say)
    "bare wav": (bare_base64(wav(_SPEECH, RATE)), "no video stream"),
    # An mp4 holding only an AAC track, labelled as a video: the container is a video's, the streams are not.
    "audio-only mp4": ("data:video/mp4;base64," + bare_base64(encoded(_SPEECH, RATE, "mp4", "aac")), "no video stream"),
    "audio data URI": (audio_data_uri(wav(_SPEECH, RATE)), "media type 'audio/wav', not a video"),
}


@pytest.mark.parametrize("name", sorted(AUDIO_AS_VIDEO))
async def test_an_audio_file_sent_as_a_video_is_refused_and_the_service_serves_on(
    video_client: httpx.AsyncClient, name: str
) -> None:
    value, said = AUDIO_AS_VIDEO[name]
    response = await video_client.post("/v1/encode", json={"items": [{"video": value}]})
    error = assert_error(response, 400, "invalid_video")
    assert error["param"] == "items[0].video" and said in error["message"]
    [item] = await encode(video_client, {"video": video_data_uri(clip(6, 32, 32, fps=4))})
    assert item["num_tokens"] > 0


# ----- the Omni models as released: the talker and the speech decoder beside the thinker -----

SPEECH_OUTPUT = {"qwen2_5_omni": (qwen2_5_omni, "token2wav"), "qwen3_omni_moe": (qwen3_omni_moe, "code2wav")}


def with_speech_output(directory: Path, family: str) -> Path:
    """The family's tiny checkpoint as the hub ships it: ``enable_audio_output`` on, and the talker's and
    the speech decoder's weights saved beside the thinker's (which are the default tiny checkpoint's)."""
    builder, _ = SPEECH_OUTPUT[family]
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(TINY_BUILDERS, family, functools.partial(builder, audio_output=True))
        return build_tiny(directory, family)


@pytest.mark.parametrize("family", sorted(SPEECH_OUTPUT))
async def test_a_released_omni_checkpoint_serves_its_thinkers_audio_rows_and_reads_no_speech_weights(
    tiny_checkpoint: Callable[..., Path], tmp_path: Path, family: str
) -> None:
    released = with_speech_output(tmp_path / family, family)
    assert json.loads((released / "config.json").read_text())["enable_audio_output"] is True
    numel = {key: tensor.numel() for key, tensor in load_file(str(released / "model.safetensors")).items()}
    assert {key.split(".", 1)[0] for key in numel} == {"thinker", "talker", SPEECH_OUTPUT[family][1]}

    items = [{"audio": audio_data_uri(file_of(samples, kind), kind)} for samples, kind in CLIPS.values()]
    async with asgi_client(model=released, cache_bytes=0) as client:
        served = await encode(client, *items)
    # The same thinker without its speech output (the default tiny checkpoint, which the tests above hold
    # to transformers' own rows): the same rows, bit for bit.
    async with asgi_client(model=tiny_checkpoint(family), cache_bytes=0) as client:
        plain = await encode(client, *items)
    for got, want in zip(served, plain, strict=True):
        assert got["num_tokens"] == want["num_tokens"] and got["metadata"] == want["metadata"]
        torch.testing.assert_close(rows_of(got), rows_of(want), atol=0, rtol=0)

    # Only the thinker's audio tower is in memory: nothing of the talker, the speech decoder, the vision
    # tower or the language model.
    adapter = load_encoder(released, device=torch.device("cpu"), dtype=torch.float32)
    loaded = dict(adapter.module.named_parameters())
    assert loaded and all(name.startswith("audio_tower.") for name in loaded)
    tower = sum(n for key, n in numel.items() if key.startswith("thinker.audio_tower."))
    speech = sum(n for key, n in numel.items() if not key.startswith("thinker."))
    assert sum(p.numel() for p in loaded.values()) == tower
    assert speech > 0 and tower < sum(numel.values()) - speech


async def test_an_audio_models_ready_line_speaks_of_no_image_processor(
    tiny_checkpoint: Callable[..., Path], caplog: pytest.LogCaptureFixture
) -> None:
    """The start log names what the checkpoint has: an audio model has no image processor to name."""
    caplog.set_level(logging.INFO, logger="mmencode.runtime")
    async with asgi_client(model=tiny_checkpoint("qwen2_audio")):
        pass
    ready = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ready: serving")]
    assert len(ready) == 1 and "qwen2_audio" in ready[0], ready
    assert "image" not in ready[0]
