"""bench/gpu.py --tiny end to end: real towers saved and served by `mmencode serve`, one table out.

Tiny bounds (a few requests, no timed loops) keep it to well under a minute on two cores; what it
checks is that every number the table reports is there, positive and consistent, and that rows per
image are what each family's own image processor (loaded from the saved directory) says.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from transformers import GotOcr2ImageProcessorPil, Qwen2VLImageProcessorPil, SiglipImageProcessorPil

from bench import gpu
from bench.towers import TOWERS

WIDTH, HEIGHT = 960, 540


def expected_rows(name: str, directory: Path, image: Image.Image) -> int:
    """Rows per image from the transformers processor the checkpoint ships, not from the adapter."""
    config = json.loads((directory / "config.json").read_text())
    if name == "qwen2.5-vl-7b":
        out = Qwen2VLImageProcessorPil.from_pretrained(directory)(images=[image], return_tensors="pt")
        t, h, w = (int(v) for v in out["image_grid_thw"][0])
        return t * h * w // config["spatial_merge_size"] ** 2
    if name == "siglip-so400m":
        out = SiglipImageProcessorPil.from_pretrained(directory)(images=[image], return_tensors="pt")
        height, width = out["pixel_values"].shape[-2:]
        return int((height // config["patch_size"]) * (width // config["patch_size"]))
    if name == "internvit-300m":
        out = GotOcr2ImageProcessorPil.from_pretrained(directory)(
            images=[image], crop_to_patches=True, return_tensors="pt"
        )
        vision = config["vision_config"]
        per_tile = (vision["image_size"][0] // vision["patch_size"][0]) ** 2 * config["downsample_ratio"] ** 2
        return int(out["num_patches"][0]) * int(per_tile)
    raise AssertionError(name)


def test_tiny_run_prints_one_consistent_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "gpu.json"
    bounds = ["--images", "4", "--concurrency", "4", "--duration", "0", "--max-requests", "8"]
    bounds += ["--bare-seconds", "0", "--batch-sizes", "1,2", "--preprocess-images", "2"]
    results = gpu.main(["--tiny", "--device", "cpu", "--root", str(tmp_path), "--image-size", f"{WIDTH}x{HEIGHT}",
                        *bounds, "--out", str(out)])  # fmt: skip
    printed = capsys.readouterr().out

    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert list(results["towers"]) == list(TOWERS)
    image = Image.open(io.BytesIO(gpu.photo_jpegs(1, WIDTH, HEIGHT)[0])).convert("RGB")
    for name, tower in results["towers"].items():
        directory = tmp_path / f"tiny-{name}"
        rows = expected_rows(name, directory, image)
        service, bare = tower["service"], tower["bare"]
        assert tower["preprocessing"]["rows_per_image"] == [rows], name
        assert service["num_tokens"] == rows and service["embedding_shape"] == [rows, tower["width"]], name
        assert service["statuses"] == {200: service["requests"]} and service["requests"] == 8, name
        assert service["images_per_s"] > 0 and 0 < service["p50_ms"] <= service["p99_ms"], name
        # Every forward of the run is in the window the metrics cover; each holds at least one image.
        assert service["server"]["forwards"] >= 1 and service["server"]["images_per_forward"] >= 1, name
        assert service["encoder_ms_per_image"] > 0 and 0 < service["encoder_busy"] <= 1.05, name
        assert set(bare["images_per_s_by_batch"]) == {1, 2} and min(bare["images_per_s_by_batch"].values()) > 0
        # bfloat16 rows as base64: 2 bytes a value, 4/3 for base64, plus the JSON around them.
        assert tower["transport"]["response_bytes"] > rows * tower["width"] * 2 * 4 / 3, name
        assert tower["preprocessing"]["decode_ms"] > 0 and tower["preprocessing"]["preprocess_ms"] > 0
        # Both CPU backends are timed (no device on a CPU run), each giving the processor's own rows; the
        # service's figure is its default backend's (torchvision, which imports here).
        by_backend = tower["preprocessing_by_backend"]
        assert set(by_backend) == {"pil", "torchvision"}, name
        assert all(prep["rows_per_image"] == [rows] and prep["preprocess_ms"] > 0 for prep in by_backend.values())
        assert tower["preprocessing"] == by_backend["torchvision"], name

    # The main table, then after a blank line the per-backend preprocessing table.
    lines = [line for line in printed.split("\n\n")[0].splitlines() if line.startswith("|")]
    assert lines[0] == "| " + " | ".join(gpu.COLUMNS) + " |"
    body = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    assert [row[0] for row in body] == list(TOWERS)
    assert all(len(row) == len(gpu.COLUMNS) for row in body)
    rows_column = gpu.COLUMNS.index("rows/img")
    assert [int(row[rows_column]) for row in body] == [t["service"]["num_tokens"] for t in results["towers"].values()]
    backend_lines = [line for line in printed.splitlines() if line.startswith("| " + next(iter(TOWERS)) + " | pil")]
    assert len(backend_lines) == 1 and len(backend_lines[0].strip("|").split("|")) == len(gpu.BACKEND_COLUMNS)


def test_client_decode_reads_back_the_rows_the_service_encodes() -> None:
    import torch

    from mmencode.app.wire.encodings import embedding_payload

    rows = torch.randn(7, 5, generator=torch.Generator().manual_seed(0))
    for encoding_format, dtype in [("base64", "bfloat16"), ("base64", "float32"), ("base64", "float16"),
                                   ("npy", "float32"), ("pt", "bfloat16"), ("float", "float32")]:  # fmt: skip
        payload = embedding_payload(rows, encoding_format=encoding_format, dtype=dtype)
        payload = json.loads(json.dumps(payload, default=lambda a: a.tolist()))
        expected = rows.to(getattr(torch, dtype)).float().numpy()
        assert np.array_equal(gpu.decode_rows(payload), expected), (encoding_format, dtype)


def test_photo_jpegs_are_distinct_images_of_the_asked_size() -> None:
    jpegs = gpu.photo_jpegs(5, 192, 108)
    assert len(set(jpegs)) == 5
    pixels = [np.asarray(Image.open(io.BytesIO(j))) for j in jpegs]
    assert all(p.shape == (108, 192, 3) for p in pixels)
    assert all(not np.array_equal(pixels[0], p) for p in pixels[1:])
