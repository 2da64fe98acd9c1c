"""Video items over HTTP, against the family's own transformers processor and model.

Servable tiny checkpoints (they carry the family's ``video_preprocessor_config.json`` and a tokenizer,
so ``AutoProcessor`` is the whole processor a user would load). Clips are encoded with PyAV
(``bench/media.py``); the reference decodes the same bytes with PyAV's ``rgb24`` frames, the pixels
transformers' own PyAV loader gives its video processors. fp32 on CPU.
"""

from __future__ import annotations

import io
import json
import shutil
import struct
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor
from transformers.video_utils import VideoMetadata

from mmencode.app.engine.errors import PayloadTooLarge
from mmencode.models.video_processor import VIDEO_PROCESSOR_FILE
from tests.helpers import (
    asgi_client,
    assert_error,
    bare_base64,
    clip,
    clip_frames,
    data_uri,
    file_server,
    image_bytes,
    noise_image,
    precomputed,
    rows_of,
    video_data_uri,
)

ATOL = 1e-5
FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5"]
# Two clips of different length and size: 9 frames (odd: the last is repeated to fill a temporal patch)
# at 10 fps in H.264, and 6 lossless FFV1 frames at 4 fps in Matroska.
CLIPS = {
    "mp4": (clip(9, 80, 60, fps=10, seed=1), 10.0),
    "mkv": (clip(6, 52, 70, fps=4, seed=2, container="mkv"), 4.0),
}


@pytest.fixture(scope="module", params=FAMILIES)
def checkpoint(request: pytest.FixtureRequest, tiny_checkpoint: Callable[..., Path]) -> Path:
    return tiny_checkpoint(request.param, layout="servable")


@pytest.fixture(scope="module")
async def client(checkpoint: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(model=checkpoint, cache_bytes=0) as client:
        yield client


@pytest.fixture(scope="module")
def reference(checkpoint: Path) -> Callable[..., dict[str, Any]]:
    return _reference_for(checkpoint)


def _reference_for(checkpoint: Path) -> Callable[..., dict[str, Any]]:
    """What transformers makes of a clip: placeholder count, metadata and the rows at the placeholders."""
    processor = AutoProcessor.from_pretrained(checkpoint)
    model = AutoModelForImageTextToText.from_pretrained(checkpoint, dtype=torch.float32).eval()
    placeholder = processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")

    def run(
        data: bytes | np.ndarray, clip_fps: float, *, cap_pixels_per_frame: bool = False, **sampling: Any
    ) -> dict[str, Any]:
        """``data``: a video file, decoded as PyAV gives its frames; or frames already sampled, taken whole.
        ``cap_pixels_per_frame``: mmencode's pin (off unless the checkpoint sets it), given explicitly."""
        if isinstance(data, bytes):
            with av.open(io.BytesIO(data)) as container:
                frames = np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])
        else:
            frames = data
        height, width = frames.shape[1:3]
        clip_info = VideoMetadata(
            total_num_frames=len(frames), fps=clip_fps, width=width, height=height, duration=len(frames) / clip_fps
        )
        if (
            isinstance(data, bytes)
            and not sampling
            and not getattr(processor.video_processor, "do_sample_frames", False)
        ):
            # mmencode's default where the checkpoint's processor keeps every frame (Qwen2-VL, Qwen2.5-VL):
            # Qwen's own 2 frames a second, what the servers these rows feed sample.
            sampling = {"fps": 2.0}
        # fps and num_frames exclude each other; Qwen3-VL's processor has an fps of its own, so both are set.
        options = {"do_sample_frames": True, "fps": None, "num_frames": None, **sampling} if sampling else {}
        if not isinstance(data, bytes):
            clip_info.frames_indices = list(range(len(frames)))
            options = {"do_sample_frames": False}
        out = processor(
            text=["<|vision_start|><|video_pad|><|vision_end|>"],
            videos=[frames],
            video_metadata=[clip_info],
            return_tensors="pt",
            cap_pixels_per_frame=cap_pixels_per_frame,
            return_metadata=True,  # which frames were sampled: Qwen3-VL's timestamps
            **options,
        )
        with torch.no_grad():
            features = model.model.get_video_features(out["pixel_values_videos"], out["video_grid_thw"])
        metadata: dict[str, Any] = {"video_grid_thw": out["video_grid_thw"][0].tolist()}
        if "second_per_grid_ts" in out:
            metadata["second_per_grid_ts"] = float(out["second_per_grid_ts"][0])
        rows = torch.cat(list(features.pooler_output))
        if hasattr(processor, "_calculate_timestamps"):  # Qwen3-VL, Qwen3.5: the "<t seconds>" of each patch
            sampled = out["video_metadata"][0]
            tps = processor.video_processor.temporal_patch_size
            metadata["timestamps"] = processor._calculate_timestamps(sampled.frames_indices, sampled.fps, tps)
        if getattr(features, "deepstack_features", None):  # Qwen3-VL: [main | DeepStack levels]
            levels = [torch.cat(list(level)) for level in features.deepstack_features]  # each split per video
            metadata["deepstack_split"] = [block.shape[-1] for block in (rows, *levels)]
            rows = torch.cat([rows, *levels], dim=-1)
        return {
            "num_tokens": int((out["input_ids"] == placeholder).sum()),
            "metadata": metadata,
            "rows": rows,
        }

    return run


def assert_same_metadata(got: dict[str, Any], want: dict[str, Any]) -> None:
    """Grids exactly; timings as numbers (the processor's are float32 tensors)."""
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key] == (pytest.approx(value) if key in {"second_per_grid_ts", "timestamps"} else value), key


async def encode(client: httpx.AsyncClient, *items: dict[str, Any]) -> list[dict[str, Any]]:
    response = await client.post("/v1/encode", json={"items": list(items)})
    assert response.status_code == 200, response.text
    return list(response.json()["items"])


@pytest.mark.parametrize("name", sorted(CLIPS))
async def test_a_clip_gives_the_processors_count_metadata_and_the_models_rows(
    client: httpx.AsyncClient, reference: Callable[..., dict[str, Any]], name: str
) -> None:
    data, fps = CLIPS[name]
    (item,) = await encode(client, {"video": video_data_uri(data, name)})
    want = reference(data, fps)
    assert item["num_tokens"] == want["num_tokens"] == item["embedding"]["shape"][0]
    assert_same_metadata(item["metadata"], want["metadata"])
    torch.testing.assert_close(rows_of(item), want["rows"], atol=ATOL, rtol=0)


@pytest.mark.parametrize("sampling", [{"fps": 5.0}, {"num_frames": 4}, {"num_frames": 5}])  # 5: odd, the last repeated
async def test_asked_sampling_is_the_processors(
    client: httpx.AsyncClient, reference: Callable[..., dict[str, Any]], sampling: dict[str, Any]
) -> None:
    data, fps = CLIPS["mp4"]
    (item,) = await encode(client, {"video": video_data_uri(data), **sampling})
    want = reference(data, fps, **sampling)
    assert item["metadata"]["video_grid_thw"][0] < 5  # fewer frames than the whole clip's 5 temporal patches
    assert item["num_tokens"] == want["num_tokens"]
    assert_same_metadata(item["metadata"], want["metadata"])
    torch.testing.assert_close(rows_of(item), want["rows"], atol=ATOL, rtol=0)


async def test_two_clips_and_an_image_in_one_request_equal_each_alone(client: httpx.AsyncClient) -> None:
    items = [
        {"video": video_data_uri(CLIPS["mp4"][0])},
        {"image": data_uri(noise_image(61, 47, seed=5))},
        {"video": video_data_uri(CLIPS["mkv"][0], "mkv")},
    ]
    together = await encode(client, *items)
    for item, alone in zip(together, [(await encode(client, item))[0] for item in items], strict=True):
        assert item["num_tokens"] == alone["num_tokens"] and item["metadata"] == alone["metadata"]
        torch.testing.assert_close(rows_of(item), rows_of(alone), atol=ATOL, rtol=0)


async def test_a_video_uploaded_as_a_file_part_equals_the_same_in_json(client: httpx.AsyncClient) -> None:
    data = CLIPS["mp4"][0]
    (inline,) = await encode(client, {"video": video_data_uri(data)})
    response = await client.post(
        "/v1/encode",
        data={"request": '{"items": [{}]}'},
        files={"items[0].video": ("clip.mp4", data, "video/mp4")},
    )
    assert response.status_code == 200, response.text
    uploaded = response.json()["items"][0]
    assert uploaded["hash"] == inline["hash"]
    torch.testing.assert_close(rows_of(uploaded), rows_of(inline), atol=0, rtol=0)


async def test_the_frames_asked_for_are_part_of_the_hash(client: httpx.AsyncClient) -> None:
    data = video_data_uri(CLIPS["mp4"][0])
    hashes = {(await encode(client, {"video": data, **s}))[0]["hash"] for s in ({}, {"fps": 5.0}, {"num_frames": 4})}
    image_of_the_same_bytes = {"image": data_uri(noise_image(8, 8))}
    assert len(hashes) == 3
    assert (await encode(client, image_of_the_same_bytes))[0]["hash"] not in hashes


async def test_precomputed_video_rows_are_checked_against_the_video_grid(client: httpx.AsyncClient) -> None:
    (item,) = await encode(client, {"video": video_data_uri(CLIPS["mp4"][0])})
    rows = rows_of(item)
    given = {"precomputed_embedding": precomputed(rows), "modality": "video", "metadata": item["metadata"]}
    (echoed,) = await encode(client, given)
    assert echoed["source"] == "precomputed" and echoed["num_tokens"] == item["num_tokens"]
    # Without the grid: named, with the field a video needs.
    response = await client.post("/v1/encode", json={"items": [{**given, "metadata": {}}]})
    error = assert_error(response, 400, "missing_metadata")
    assert error["param"] == "items[0].metadata.video_grid_thw"
    timed = "timestamps" in item["metadata"]  # Qwen3-VL, Qwen3.5: the language side writes them as text
    assert error["details"]["required"] == ["video_grid_thw", "timestamps"] if timed else ["video_grid_thw"]
    if timed:
        untimed = {k: v for k, v in item["metadata"].items() if k != "timestamps"}
        response = await client.post("/v1/encode", json={"items": [{**given, "metadata": untimed}]})
        assert assert_error(response, 400, "missing_metadata")["param"] == "items[0].metadata.timestamps"
        one_short = {**item["metadata"], "timestamps": item["metadata"]["timestamps"][:-1]}
        response = await client.post("/v1/encode", json={"items": [{**given, "metadata": one_short}]})
        assert "one per temporal patch" in assert_error(response, 422, "validation_error")["message"]
    # The rows of one temporal patch fewer than the grid says.
    short = {**given, "precomputed_embedding": precomputed(rows[: -item["num_tokens"] // 5])}
    response = await client.post("/v1/encode", json={"items": [short]})
    assert_error(response, 400, "precomputed_shape_mismatch")


async def test_embeddings_give_one_vector_per_video(client: httpx.AsyncClient) -> None:
    uri = video_data_uri(CLIPS["mp4"][0])
    (item,) = await encode(client, {"video": uri})
    main_width = item["metadata"].get("deepstack_split", [None])[0]  # Qwen3-VL: the main embedding only
    mean = rows_of(item)[:, :main_width].mean(dim=0)
    want = mean / mean.norm()
    bare = uri.split(",", 1)[1]  # no media type: `modality` says it is a video
    model = (await client.get("/v1/models")).json()["data"][0]["id"]
    for body in ({"input": [uri]}, {"input": bare, "modality": "video"}):
        response = await client.post("/v1/embeddings", json={"model": model, **body})
        assert response.status_code == 200, response.text
        vector = torch.tensor(response.json()["data"][0]["embedding"])
        torch.testing.assert_close(vector, want, atol=1e-6, rtol=0)
        assert response.json()["usage"]["prompt_tokens"] == item["num_tokens"]


async def test_a_video_as_bare_base64_equals_its_data_uri(client: httpx.AsyncClient) -> None:
    """No media type: the ``video`` field says what it is, and the container is sniffed from the bytes."""
    for container in ("mp4", "mkv"):
        data = CLIPS[container][0]
        (bare,) = await encode(client, {"video": bare_base64(data)})
        (uri,) = await encode(client, {"video": video_data_uri(data, container)})
        assert bare["hash"] == uri["hash"] and bare["metadata"] == uri["metadata"], container
        assert bare["num_tokens"] == uri["num_tokens"] > 0
        torch.testing.assert_close(rows_of(bare), rows_of(uri), atol=0, rtol=0)


# ----- cap_pixels_per_frame: the checkpoint's value, else off, whatever transformers' default -----

# Pixel budgets small enough that the per-frame cap binds on a 10-frame 128x96 clip (the default budgets
# are far above any test clip's). Qwen2-VL: `max_video_tokens` bounds the whole clip, shared evenly over
# its frames; Qwen3-VL: each frame's tokens, and `size` bounds frames x pixels.
CAPPED_BUDGETS = {
    "Qwen2VLVideoProcessor": {"size": {"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 64}, "max_video_tokens": 20},
    "Qwen3VLVideoProcessor": {"size": {"shortest_edge": 64 * 64, "longest_edge": 32 * 32 * 64}, "max_video_tokens": 2},
}


def _with_video_settings(checkpoint: Path, into: Path, **settings: Any) -> Path:
    """A copy of ``checkpoint`` whose video processor config has ``settings`` on top of its own."""
    shutil.copytree(checkpoint, into)
    path = into / VIDEO_PROCESSOR_FILE
    path.write_text(json.dumps({**json.loads(path.read_text()), **settings}, indent=2))
    return into


@pytest.mark.parametrize("setting", [None, True], ids=["unset-is-off", "set-on-is-followed"])
async def test_the_per_frame_pixel_cap_is_the_checkpoints_else_off(
    checkpoint: Path, tmp_path: Path, setting: bool | None
) -> None:
    """transformers 5.24 leaves the cap off when asked nothing, and says the default will flip: mmencode
    pins it, so a checkpoint that says nothing keeps the uncapped grid on any release."""
    video = json.loads((checkpoint / VIDEO_PROCESSOR_FILE).read_text())
    assert video.get("cap_pixels_per_frame") is None  # the tiny checkpoints say nothing
    budgets = CAPPED_BUDGETS[video["video_processor_type"]]
    extra = {} if setting is None else {"cap_pixels_per_frame": setting}
    variant = _with_video_settings(checkpoint, tmp_path / "variant", **budgets, **extra)
    data, fps = clip(10, 128, 96, fps=10, seed=11), 10.0
    async with asgi_client(model=variant, cache_bytes=0) as client:
        (item,) = await encode(client, {"video": video_data_uri(data)})
    reference = _reference_for(variant)
    capped = bool(setting)
    want = reference(data, fps, cap_pixels_per_frame=capped)
    # The cap binds here: the other value gives another grid, so a flipped pin would fail this test.
    other = reference(data, fps, cap_pixels_per_frame=not capped)
    t, h, w = want["metadata"]["video_grid_thw"]
    t_other, h_other, w_other = other["metadata"]["video_grid_thw"]
    assert t == t_other and (h * w < h_other * w_other if capped else h * w > h_other * w_other)
    assert item["num_tokens"] == want["num_tokens"] == item["embedding"]["shape"][0] != other["num_tokens"]
    assert_same_metadata(item["metadata"], want["metadata"])
    torch.testing.assert_close(rows_of(item), want["rows"], atol=ATOL, rtol=0)


# ----- a clip given as its frames, already sampled -----


def _frame_uris(count: int, width: int = 72, height: int = 56, seed: int = 21) -> tuple[np.ndarray, list[str]]:
    frames = clip_frames(count, width, height, seed)
    return frames, [data_uri(Image.fromarray(frame)) for frame in frames]  # PNG: the pixels as they are


@pytest.mark.parametrize("count", [5, 6])  # 5: odd, the last frame repeated to fill a temporal patch
async def test_a_frame_list_gives_the_processors_count_metadata_and_the_models_rows(
    client: httpx.AsyncClient, reference: Callable[..., dict[str, Any]], count: int
) -> None:
    frames, uris = _frame_uris(count)
    (item,) = await encode(client, {"video": uris, "fps": 1.5})
    want = reference(frames, 1.5)
    assert item["num_tokens"] == want["num_tokens"] == item["embedding"]["shape"][0]
    assert item["metadata"]["video_grid_thw"][0] == (count + 1) // 2  # taken whole: no sampling
    assert_same_metadata(item["metadata"], want["metadata"])
    torch.testing.assert_close(rows_of(item), want["rows"], atol=ATOL, rtol=0)


async def test_a_frame_lists_hash_covers_its_frames_order_and_rate(client: httpx.AsyncClient) -> None:
    _, uris = _frame_uris(4)
    first = (await encode(client, {"video": uris, "fps": 2}))[0]
    assert (await encode(client, {"video": uris, "fps": 2}))[0]["hash"] == first["hash"]
    others = [{"video": uris, "fps": 4}, {"video": uris[::-1], "fps": 2}, {"video": uris[:2], "fps": 2}]
    hashes = {first["hash"], *[(await encode(client, other))[0]["hash"] for other in others]}
    assert len(hashes) == 4


async def test_bad_frame_lists_are_refused_naming_the_frame(client: httpx.AsyncClient, checkpoint: Path) -> None:
    _, uris = _frame_uris(3)
    wrong_size = [*uris[:2], data_uri(noise_image(40, 40, seed=9))]
    response = await client.post("/v1/encode", json={"items": [{"video": wrong_size, "fps": 2}]})
    error = assert_error(response, 400, "invalid_video")
    assert "frame 2 of the list is 40x40, frame 0 72x56" in error["message"] and error["param"] == "items[0].video"
    response = await client.post("/v1/encode", json={"items": [{"video": [uris[0], "not base64!"], "fps": 2}]})
    assert assert_error(response, 400, "invalid_image")["param"] == "items[0].video[1]"
    for item in ({"video": uris}, {"video": uris, "fps": 2, "num_frames": 2}, {"video": [], "fps": 2}):
        assert_error(await client.post("/v1/encode", json={"items": [item]}), 422, "validation_error")
    async with asgi_client(model=checkpoint, max_video_frames=2) as few:
        response = await few.post("/v1/encode", json={"items": [{"video": uris, "fps": 2}]})
    assert assert_error(response, 413, "payload_too_large")["details"]["frames"] == 3


# ----- hostile and mistaken inputs: a clear 4xx each, and the service serves on -----


def _truncated() -> bytes:
    data = clip(9, 80, 60, fps=10, seed=3)
    return data[: len(data) * 2 // 3]


def _no_frames() -> bytes:
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as output:
        stream = output.add_stream("libx264", rate=10)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        output.start_encoding()  # the header and an empty stream: no frame is ever written
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("field", "value", "status", "code"),
    [
        ("video", bare_base64(_truncated()), 400, "invalid_video"),
        ("video", bare_base64(_no_frames()), 400, "invalid_video"),
        ("video", bare_base64(image_bytes(noise_image(64, 48))), 400, "invalid_video"),  # an image sent as a video
        ("image", bare_base64(CLIPS["mp4"][0]), 400, "invalid_image"),  # a video sent as an image
        # ...and under a media type that says it is an image: the bytes decide, not the label.
        ("image", "data:image/png;base64," + bare_base64(CLIPS["mp4"][0]), 400, "invalid_image"),
        ("video", bare_base64(b"\x00\x00\x00\x18ftypmp42" + bytes(200)), 400, "invalid_video"),
    ],
    ids=["truncated", "no-frames", "image-as-video", "video-as-image", "video-in-a-png-uri", "header-only"],
)
async def test_a_bad_video_is_refused_and_the_service_serves_on(
    client: httpx.AsyncClient, field: str, value: str, status: int, code: str
) -> None:
    response = await client.post("/v1/encode", json={"items": [{field: value}]})
    error = assert_error(response, status, code)
    assert error["param"] == f"items[0].{field}"
    assert (await encode(client, {"video": video_data_uri(CLIPS["mkv"][0], "mkv")}))[0]["num_tokens"] > 0


def _ten_hour_header() -> bytes:
    """Six frames in Matroska whose Segment Info declares ten hours (Duration: 36e6 ms)."""
    data = CLIPS["mkv"][0]
    at = data.find(b"\x44\x89\x88")  # the Duration element, an 8-byte float
    assert at > 0
    return data[: at + 3] + struct.pack(">d", 36e6) + data[at + 11 :]


async def test_a_long_video_is_refused_from_its_header_before_any_decoding(
    client: httpx.AsyncClient, checkpoint: Path, reference: Callable[..., dict[str, Any]]
) -> None:
    response = await client.post("/v1/encode", json={"items": [{"video": video_data_uri(_ten_hour_header(), "mkv")}]})
    error = assert_error(response, 413, "payload_too_large")
    assert error["details"]["limit"] == "max_video_seconds" and error["details"]["seconds"] == 36000
    assert "header declares 36000.0 s" in error["message"] and error["param"] == "items[0].video"
    # The service serves on: the same six frames under their true header encode as the processor's.
    data, fps = CLIPS["mkv"]
    (item,) = await encode(client, {"video": video_data_uri(data, "mkv")})
    want = reference(data, fps)
    assert item["num_tokens"] == want["num_tokens"]
    torch.testing.assert_close(rows_of(item), want["rows"], atol=ATOL, rtol=0)
    # A header that tells the truth, over a lower limit: 9 frames at 10 fps are 0.9 s.
    async with asgi_client(model=checkpoint, max_video_seconds=0.5) as short:
        response = await short.post("/v1/encode", json={"items": [{"video": video_data_uri(CLIPS["mp4"][0])}]})
    assert assert_error(response, 413, "payload_too_large")["details"]["seconds"] == pytest.approx(0.9)


async def test_the_frame_limit_counts_the_frames_kept_and_the_row_limit_the_rows(
    client: httpx.AsyncClient, checkpoint: Path
) -> None:
    short = {"video": video_data_uri(clip(4, 80, 60, seed=4))}
    (item,) = await encode(client, short)
    nine = video_data_uri(CLIPS["mp4"][0])
    async with asgi_client(model=checkpoint, max_video_frames=4) as few_frames:
        # The clip has 9 frames; 6 asked for are over the limit of 4, before any decoding...
        response = await few_frames.post("/v1/encode", json={"items": [{"video": nine, "num_frames": 6}]})
        error = assert_error(response, 413, "payload_too_large")
        assert error["details"]["limit"] == "max_video_frames" and error["details"]["frames"] == 6
        # ...while 2 of the same clip are within it.
        response = await few_frames.post("/v1/encode", json={"items": [{"video": nine, "num_frames": 2}]})
        assert response.status_code == 200, response.text
    async with asgi_client(model=checkpoint, max_video_tokens=item["num_tokens"] - 1) as few_rows:
        response = await few_rows.post("/v1/encode", json={"items": [short]})
        error = assert_error(response, 413, "payload_too_large")
        assert error["details"]["limit"] == "max_video_tokens" and error["details"]["rows"] == item["num_tokens"]


async def test_frames_asked_past_the_limit_or_none_at_all_are_refused(client: httpx.AsyncClient) -> None:
    uri = video_data_uri(CLIPS["mp4"][0])
    response = await client.post("/v1/encode", json={"items": [{"video": uri, "num_frames": 10**9}]})
    assert assert_error(response, 413, "payload_too_large")["details"]["frames"] == 10**9  # before any listing
    # One frame: Qwen2-VL's sampler rounds it to none (a division by zero inside), Qwen3-VL's tower needs two.
    response = await client.post("/v1/encode", json={"items": [{"video": uri, "num_frames": 1}]})
    assert assert_error(response, 400, "invalid_video")["param"] == "items[0].video"


def test_a_frame_rate_no_camera_has_does_not_make_a_long_clip_short() -> None:
    from mmencode.app.media.video import VideoLimits, decode_video

    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="matroska") as output:
        stream = output.add_stream("ffv1", rate=1000)  # 1,500 frames "in 1.5 s"
        stream.width, stream.height, stream.pix_fmt = 16, 16, "yuv444p"
        for _ in range(1500):
            output.mux(stream.encode(av.VideoFrame.from_ndarray(np.zeros((16, 16, 3), np.uint8), format="rgb24")))
        output.mux(stream.encode())
    limits = VideoLimits(max_seconds=10, max_frames=8, max_frame_pixels=10**6, max_decoded_bytes=10**8)

    def keep(total: int, fps: float | None) -> list[int]:
        raise AssertionError("refused before sampling")

    with pytest.raises(PayloadTooLarge) as refused:
        decode_video(buffer.getvalue(), limits, keep)
    assert refused.value.details["limit"] == "max_video_seconds"  # 1,500 frames at 120 fps at most: 12.5 s


async def test_a_frame_list_is_held_to_the_video_byte_limit(checkpoint: Path) -> None:
    _, uris = _frame_uris(6)
    async with asgi_client(model=checkpoint, max_video_bytes=3 * len(uris[0]) * 3 // 4) as small:
        response = await small.post("/v1/encode", json={"items": [{"video": uris, "fps": 2}]})
    assert assert_error(response, 413, "payload_too_large")["details"]["limit"] == "max_video_bytes"


# The per-file limits, each just under what the 9-frame 80x60 mp4 needs with 8 of its frames kept (asked).
FILE_LIMITS = {
    "max_video_bytes": ({"max_video_bytes": len(CLIPS["mp4"][0]) - 1}, "max_video_bytes"),
    "max_image_pixels": ({"max_image_pixels": 80 * 60 - 1}, "max_image_pixels"),
    "max_video_decoded_bytes": ({"max_video_decoded_bytes": 8 * 80 * 60 * 3 - 1}, "max_video_decoded_bytes"),
}


@pytest.mark.parametrize("name", sorted(FILE_LIMITS))
async def test_a_video_file_over_a_limit_is_refused_naming_it(tiny_checkpoint: Callable[..., Path], name: str) -> None:
    """One family is enough: the limits are checked before any family's processor sees the clip."""
    settings, limit = FILE_LIMITS[name]
    uri = video_data_uri(CLIPS["mp4"][0])
    async with asgi_client(model=tiny_checkpoint("qwen2_vl", layout="servable"), cache_bytes=0, **settings) as small:
        response = await small.post("/v1/encode", json={"items": [{"video": uri, "num_frames": 8}]})
        error = assert_error(response, 413, "payload_too_large")
        assert error["details"]["limit"] == limit and error["param"] == "items[0].video"
        # The same clip at 4 frames is within the decoded-bytes limit; the other two do not depend on sampling.
        if name == "max_video_decoded_bytes":
            response = await small.post("/v1/encode", json={"items": [{"video": uri, "num_frames": 4}]})
            assert response.status_code == 200, response.text


async def test_a_webm_clip_by_url_equals_the_same_bytes_inline(
    checkpoint: Path, reference: Callable[..., dict[str, Any]], tmp_path: Path
) -> None:
    """A VP9 webm fetched from an http URL (``video/webm``): the same item as its data URI, and the
    processor's and model's own for the clip."""
    data = clip(7, 64, 48, fps=6, seed=7, container="webm")
    (tmp_path / "clip.webm").write_bytes(data)
    with file_server(tmp_path) as base:
        async with asgi_client(model=checkpoint, cache_bytes=0, allowed_url_hosts=["127.0.0.1"]) as client:
            by_url, inline = await encode(
                client, {"video": f"{base}/clip.webm"}, {"video": video_data_uri(data, "webm")}
            )
    assert by_url["hash"] == inline["hash"] and by_url["metadata"] == inline["metadata"]
    torch.testing.assert_close(rows_of(by_url), rows_of(inline), atol=0, rtol=0)
    want = reference(data, 6.0)
    assert by_url["num_tokens"] == want["num_tokens"]
    assert_same_metadata(by_url["metadata"], want["metadata"])
    torch.testing.assert_close(rows_of(by_url), want["rows"], atol=ATOL, rtol=0)


def test_only_the_frames_kept_are_converted_and_they_are_pyavs_own() -> None:
    from mmencode.app.media.video import VideoLimits, decode_video

    data = CLIPS["mp4"][0]
    with av.open(io.BytesIO(data)) as container:
        every = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    asked: list[tuple[int, float | None]] = []

    def keep(total: int, fps: float | None) -> list[int]:
        asked.append((total, fps))
        return [0, 4, 8]

    limits = VideoLimits(max_seconds=60, max_frames=3, max_frame_pixels=10**6, max_decoded_bytes=3 * 80 * 60 * 3)
    video = decode_video(data, limits, keep)
    assert asked == [(9, 10.0)]  # counted before decoding
    assert video.total_frames == 9 and video.indices == [0, 4, 8] and video.frames.shape == (3, 60, 80, 3)
    for got, index in zip(video.frames, video.indices, strict=True):
        assert np.array_equal(got, every[index])


async def test_a_video_for_an_image_only_model_is_refused_before_any_work(
    tiny_checkpoint: Callable[..., Path],
) -> None:
    async with asgi_client(model=tiny_checkpoint("siglip")) as images_only:
        response = await images_only.post(
            "/v1/encode", json={"items": [{"video": "https://198.51.100.1/clip.mp4"}]}
        )  # never fetched: refused first
    error = assert_error(response, 400, "unsupported_modality")
    assert error["param"] == "items[0].video" and "siglip" in error["message"]


@pytest.mark.parametrize(
    "item",
    [
        {"image": "QUJD" * 10, "video": "QUJD" * 10},
        {"image": "QUJD" * 10, "fps": 2},
        {"video": "QUJD" * 10, "fps": 2, "num_frames": 4},
        {"video": "QUJD" * 10, "modality": "image"},
    ],
    ids=["image-and-video", "fps-on-image", "fps-and-num-frames", "contradicting-modality"],
)
async def test_contradicting_video_fields_are_a_validation_error(
    client: httpx.AsyncClient, item: dict[str, Any]
) -> None:
    assert_error(await client.post("/v1/encode", json={"items": [item]}), 422, "validation_error")
