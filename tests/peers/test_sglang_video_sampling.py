"""`"sampling": "sglang"` (and `--video-sampling sglang`) against SGLang 0.5.23's own ``preprocess_video``.

SGLang's code runs in the vLLM oracle's environment (tests/peers/sglang_video.py says why) on the frames
PyAV decodes here. Checked: the frames it keeps and the pixels it resizes them to, for clips of many
lengths, rates and sizes; then, over HTTP per family, that mmencode's rows equal the model's own features
of SGLang's frames through the checkpoint's video processor (as SGLang's encoder calls it), with the
metadata SGLang's encoder sends. Not exercised: SGLang's per-clip pixel budget, which binds only past 300
kept frames of over 0.6 MP each (gigabytes of frames here); its formula is the same function's.
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor
from transformers.video_utils import VideoMetadata

from mmencode.app.peers.sglang.sampling import sglang_frame_indices, sglang_resize_frames
from tests.helpers import asgi_client, assert_error, clip, rows_of, video_data_uri
from tests.peers.run import sglang_preprocess_video

ATOL = 1e-5
FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5"]
# (file, its frame rate, the item's sampling settings): 9 frames (4 kept of 9), 6 lossless FFV1 frames
# (4 of 6), and 25 frames at 5 a second asked for (12, indices truncated where transformers rounds).
CLIPS = {
    "mp4": (clip(9, 80, 60, fps=10, seed=1), 10.0, {}),
    "mkv": (clip(6, 52, 70, fps=4, seed=2, container="mkv"), 4.0, {}),
    "mp4-fps5": (clip(25, 64, 48, fps=10, seed=3), 10.0, {"fps": 5.0}),
}


def _decoded(data: bytes) -> np.ndarray:
    with av.open(io.BytesIO(data)) as container:
        return np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])


def _sglang_config(sampling: dict[str, Any]) -> dict[str, Any]:
    """An item's `fps` / `num_frames` as SGLang's video settings name them."""
    return {"nframes" if key == "num_frames" else key: value for key, value in sampling.items()}


def _noise(frames: int, height: int, width: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (frames, height, width, 3), dtype=np.uint8)


# (frames, height, width, clip fps, the item's sampling): short and long clips, odd counts, NTSC rates,
# sizes to upscale to SGLang's minimum and to cap at its maximum, an aspect ratio past its limit.
SAMPLING_CASES = [
    (2, 16, 16, 30.0, {}),
    (3, 16, 24, 1.0, {}),
    (9, 60, 80, 10.0, {}),
    (61, 16, 16, 23.976, {}),
    (240, 8, 8, 29.97, {}),
    (1601, 4, 4, 30.0, {}),  # past the 768-frame cap
    (25, 16, 16, 10.0, {"fps": 5.0}),
    (25, 16, 16, 10.0, {"fps": 0.5}),  # fewer than the minimum of 4: 4
    (9, 16, 16, 10.0, {"num_frames": 5}),  # rounded half to even: 4
    (9, 16, 16, 10.0, {"num_frames": 7}),
    (9, 720, 1280, 10.0, {}),  # over 768 tiles of 28x28: scaled down
    (5, 1, 300, 10.0, {}),  # refused: aspect ratio over 200
    (1, 16, 16, 10.0, {}),  # refused: one frame
    (9, 16, 16, 10.0, {"fps": 30.0}),  # more frames a second than the clip has: its own, floored to 8
    (9, 16, 16, 10.0, {"num_frames": 1}),  # refused: no frame
]


@pytest.fixture(scope="module")
def sglang(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """SGLang's answers, from one run of its code: for SAMPLING_CASES, and for each clip of CLIPS."""
    cases: list[dict[str, Any]] = [
        {"frames": torch.from_numpy(_noise(n, h, w, seed=n + h)), "fps": fps, "config": _sglang_config(asked)}
        for n, h, w, fps, asked in SAMPLING_CASES
    ]
    cases += [
        {"frames": torch.from_numpy(_decoded(data)), "fps": fps, "config": _sglang_config(asked)}
        for data, fps, asked in CLIPS.values()
    ]
    answers = sglang_preprocess_video(cases, tmp_path_factory.mktemp("sglang-video"))
    return {"cases": answers[: len(SAMPLING_CASES)], "clips": answers[len(SAMPLING_CASES) :]}


@pytest.mark.parametrize("case", range(len(SAMPLING_CASES)), ids=[str(c[:4]) for c in SAMPLING_CASES])
def test_the_frames_and_pixels_are_sglangs_own(sglang: dict[str, list[dict[str, Any]]], case: int) -> None:
    n, h, w, fps, asked = SAMPLING_CASES[case]
    frames, want = _noise(n, h, w, seed=n + h), sglang["cases"][case]
    try:
        indices = sglang_frame_indices(n, fps, **asked)
        video = sglang_resize_frames(frames[indices])
    except ValueError as exc:
        assert "error" in want, f"SGLang samples this clip; mmencode refused it: {exc}"
        return
    assert "error" not in want, f"SGLang refuses this clip ({want.get('error')}); mmencode sampled it"
    assert indices == want["indices"]
    assert video.shape == want["video"].shape
    assert torch.equal(video, want["video"])  # the same pixels, not close ones


@pytest.fixture(scope="module", params=FAMILIES)
def checkpoint(request: pytest.FixtureRequest, tiny_checkpoint: Callable[..., Path]) -> Path:
    return tiny_checkpoint(request.param, layout="servable")


@pytest.fixture(scope="module")
async def client(checkpoint: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(model=checkpoint, cache_bytes=0) as client:
        yield client


def _reference(checkpoint: Path, clip_fps: float, asked: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """What SGLang's encoder makes of SGLang's frames: the checkpoint's processor with ``do_sample_frames``
    off and SGLang's metadata, then the model's own video features."""
    processor = AutoProcessor.from_pretrained(checkpoint)
    model = AutoModelForImageTextToText.from_pretrained(checkpoint, dtype=torch.float32).eval()
    indices, total = answer["indices"], int(answer.get("total", 0))
    metadata = VideoMetadata(total_num_frames=total, fps=clip_fps, frames_indices=indices)
    out = processor(
        text=["<|vision_start|><|video_pad|><|vision_end|>"],
        videos=[answer["video"]],
        video_metadata=[metadata],
        do_sample_frames=False,
        cap_pixels_per_frame=False,  # mmencode's pin (models/video_processor.py)
        return_tensors="pt",
    )
    with torch.no_grad():
        features = model.model.get_video_features(out["pixel_values_videos"], out["video_grid_thw"])
    rows = torch.cat(list(features.pooler_output))
    grid = out["video_grid_thw"][0].tolist()
    want: dict[str, Any] = {"video_grid_thw": grid}
    if getattr(features, "deepstack_features", None):
        levels = [torch.cat(list(level)) for level in features.deepstack_features]
        want["deepstack_split"] = [block.shape[-1] for block in (rows, *levels)]
        rows = torch.cat([rows, *levels], dim=-1)
    if hasattr(processor, "_calculate_timestamps"):  # Qwen3-VL, Qwen3.5: SGLang's encoder's own times
        want["timestamps"] = answer["timestamps"]
    elif "second_per_grid_ts" in out:
        # SGLang's encoder: temporal_patch_size / (its video fps setting, else 2), not the sampled rate.
        want["second_per_grid_ts"] = processor.video_processor.temporal_patch_size / asked.get("fps", 2.0)
    placeholder = processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    return {"num_tokens": int((out["input_ids"] == placeholder).sum()), "metadata": want, "rows": rows}


async def _encode(client: httpx.AsyncClient, *items: dict[str, Any]) -> list[dict[str, Any]]:
    response = await client.post("/v1/encode", json={"items": list(items)})
    assert response.status_code == 200, response.text
    return list(response.json()["items"])


@pytest.mark.parametrize("name", list(CLIPS))
async def test_a_clip_sampled_as_sglang_gives_the_rows_of_sglangs_frames(
    client: httpx.AsyncClient, checkpoint: Path, sglang: dict[str, list[dict[str, Any]]], name: str
) -> None:
    data, fps, asked = CLIPS[name]
    answer = sglang["clips"][list(CLIPS).index(name)]
    (item,) = await _encode(client, {"video": video_data_uri(data, name.split("-")[0]), "sampling": "sglang", **asked})
    want = _reference(checkpoint, fps, asked, {**answer, "total": len(_decoded(data))})
    assert item["num_tokens"] == want["num_tokens"] == item["embedding"]["shape"][0]
    got = item["metadata"]
    assert set(got) == set(want["metadata"])
    for key, value in want["metadata"].items():
        assert got[key] == (pytest.approx(value) if key in {"second_per_grid_ts", "timestamps"} else value), key
    torch.testing.assert_close(rows_of(item), want["rows"], atol=ATOL, rtol=0)


async def test_the_server_default_rule_is_the_one_an_item_without_sampling_follows(
    client: httpx.AsyncClient, checkpoint: Path
) -> None:
    data, _, _ = CLIPS["mp4"]
    video = video_data_uri(data)
    (sglang_item,) = await _encode(client, {"video": video, "sampling": "sglang"})
    (checkpoint_item,) = await _encode(client, {"video": video})
    assert (await _encode(client, {"video": video, "sampling": "checkpoint"}))[0]["hash"] == checkpoint_item["hash"]
    assert sglang_item["hash"] != checkpoint_item["hash"]  # other frames, other rows: never one cache entry
    async with asgi_client(model=checkpoint, cache_bytes=0, video_sampling="sglang") as behind_sglang:
        (default,) = await _encode(behind_sglang, {"video": video})
        (asked_back,) = await _encode(behind_sglang, {"video": video, "sampling": "checkpoint"})
    assert default["hash"] == sglang_item["hash"]
    torch.testing.assert_close(rows_of(default), rows_of(sglang_item), atol=0, rtol=0)
    assert asked_back["hash"] == checkpoint_item["hash"]


@pytest.mark.parametrize(
    "item",
    [
        {"image": "QUJD", "sampling": "sglang"},
        {"video": ["QUJD"], "fps": 2, "sampling": "sglang"},
        {"video": "QUJD", "sampling": "vllm"},
    ],
    ids=["on-an-image", "on-a-frame-list", "unknown-rule"],
)
async def test_a_sampling_rule_where_none_applies_is_a_validation_error(
    client: httpx.AsyncClient, item: dict[str, Any]
) -> None:
    response = await client.post("/v1/encode", json={"items": [item]})
    assert_error(response, 422, "validation_error")
