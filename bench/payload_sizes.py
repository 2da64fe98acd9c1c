"""Response sizes of one image's rows in each ``/v1/encode`` encoding, on the tiny default checkpoint.

    .venv/bin/python -m bench.payload_sizes [--size 448]

Sizes are of the item's ``embedding`` object as the service writes it (JSON), built by the same
functions the route uses; the rows come from the tiny Qwen2-VL checkpoint run on one noise image.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from mmencode.app.wire.encodings import embedding_payload
from mmencode.app.wire.json import dumps_json
from mmencode.models import load_encoder
from mmencode.models.tiny import build_tiny


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", type=int, default=448, help="square image side in pixels")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        adapter = load_encoder(
            build_tiny(Path(tmp) / "tiny", "qwen2_vl"), device=torch.device("cpu"), dtype=torch.float32
        )
        pixels = np.random.default_rng(0).integers(0, 256, (args.size, args.size, 3), dtype=np.uint8)
        prepared = adapter.preprocess(Image.fromarray(pixels))
        rows = adapter.forward([prepared]).rows
    print(f"{args.size}x{args.size} image: rows {list(rows.shape)}, grid {prepared.metadata.get('image_grid_thw')}")
    for encoding_format, dtype in [
        ("pt", "bfloat16"), ("pt", "float32"), ("npy", "float16"), ("npy", "float32"),
        ("base64", "bfloat16"), ("base64", "float32"), ("float", "float32"),
    ]:  # fmt: skip
        size = len(dumps_json(embedding_payload(rows, encoding_format=encoding_format, dtype=dtype)))
        print(f"{encoding_format:>7} {dtype:<9} {size:>9,} bytes")


if __name__ == "__main__":
    main()
