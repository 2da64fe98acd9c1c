"""bfloat16 vs float32 on the CPU for the mid-size tower: speed, and how far bf16 rows move.

python -m bench.precision --images 8
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from bench.checkpoints import build_checkpoint
from bench.common import jpeg_images
from mmencode.app.media.image import decode_image
from mmencode.models import load_encoder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default="mid")
    parser.add_argument("--root", type=Path, default=Path(".cache/bench"))
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    checkpoint = build_checkpoint(args.checkpoint, args.root)
    images = [decode_image(j, max_pixels=10**9) for j in jpeg_images(args.images, 320, 240, seed=3)]
    results: dict[str, object] = {"checkpoint": args.checkpoint, "images": args.images}
    rows: dict[str, torch.Tensor] = {}
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        adapter = load_encoder(checkpoint, device=torch.device("cpu"), dtype=dtype)
        prepared = [adapter.preprocess(image) for image in images]
        adapter.forward(prepared[:1])
        started = time.perf_counter()
        for _ in range(args.repeats):
            rows[name] = adapter.forward(prepared).rows
        results[f"{name}_ms_per_image"] = round((time.perf_counter() - started) / args.repeats / len(images) * 1000, 1)
    diff = (rows["bfloat16"] - rows["float32"]).abs()
    scale = rows["float32"].abs().max()
    results["max_abs_diff"] = float(diff.max())
    results["max_abs_diff_relative_to_max_abs_value"] = round(float(diff.max() / scale), 4)
    cosine = torch.nn.functional.cosine_similarity(rows["bfloat16"], rows["float32"], dim=-1)
    results["min_row_cosine"] = round(float(cosine.min()), 5)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
