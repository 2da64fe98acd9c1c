"""CLIP and SigLIP preprocessing: transformers' PIL processor vs the service's verified fast path.

    python -m bench.fixed_preprocess --images 64 --size 320x240

Per image, on one thread, JPEGs decoded by the service's own ``decode_image`` first (decoding is not
timed). Every output of the fast path is compared with transformers' (``torch.equal``) before it is
timed; the script stops on any difference.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import torch
from PIL import Image
from transformers import CLIPImageProcessorPil, SiglipImageProcessorPil

from bench.common import jpeg_images
from mmencode.app.images import decode_image
from mmencode.models.fixed_preprocess import FixedResolutionPreprocessor

# The bench's tiny CLIP (bench/infinity/make_clip.py), OpenAI CLIP at 224 and 336, SigLIP at 224 and 384.
SETTINGS: dict[str, Any] = {
    "clip-tiny-64": CLIPImageProcessorPil(size={"shortest_edge": 64}, crop_size={"height": 64, "width": 64}),
    "clip-224": CLIPImageProcessorPil(),
    "clip-336": CLIPImageProcessorPil(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336}),
    "siglip-224": SiglipImageProcessorPil(),
    "siglip-384": SiglipImageProcessorPil(size={"height": 384, "width": 384}),
}


def per_image_ms(run: Callable[[Image.Image], Any], images: list[Image.Image]) -> float:
    for image in images[:4]:
        run(image)
    started = time.perf_counter()
    for image in images:
        run(image)
    return (time.perf_counter() - started) / len(images) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--size", default="320x240")
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    images = [decode_image(jpeg, max_pixels=10**9) for jpeg in jpeg_images(args.images, width, height, seed=11)]
    results: dict[str, Any] = {"image_size": args.size, "images": len(images)}
    for name, processor in SETTINGS.items():
        fast = FixedResolutionPreprocessor.verified(processor)
        if fast is None:
            raise SystemExit(f"{name}: the fast path did not verify against transformers")

        def reference(image: Image.Image, processor: Any = processor) -> torch.Tensor:
            return processor(images=[image], return_tensors="pt")["pixel_values"]

        for image in images:
            if not torch.equal(fast(image), reference(image)):  # type: ignore[arg-type]
                raise SystemExit(f"{name}: pixel values differ from transformers' on a {image.size} image")
        transformers_ms = per_image_ms(reference, images)
        fast_ms = per_image_ms(fast, images)
        results[name] = {
            "transformers_ms": round(transformers_ms, 3),
            "fast_ms": round(fast_ms, 3),
            "speedup": round(transformers_ms / fast_ms, 2),
        }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
