"""Preprocessing: transformers' PIL processor vs the service's verified fast paths.

    python -m bench.fixed_preprocess --images 64 --size 320x240 --qwen-sizes 392x392,640x480

CLIP and SigLIP (``models/fixed_preprocess.py``) on ``--size`` images; the Qwen2-VL processor
(``models/dynamic_preprocess.py``, also Qwen2.5-VL's and Qwen3-VL's) on each of ``--qwen-sizes``. Per
image, on one thread, JPEGs decoded by the service's own ``decode_image`` first (decoding is not
timed). Every output of a fast path is compared with transformers' (the same keys, dtypes and bits)
before it is timed; the script stops on any difference.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
from PIL import Image
from transformers import CLIPImageProcessorPil, Qwen2VLImageProcessorPil, SiglipImageProcessorPil

from bench.common import jpeg_images
from mmencode.app.images import decode_image
from mmencode.models.dynamic_preprocess import DynamicResolutionPreprocessor
from mmencode.models.fixed_preprocess import FixedResolutionPreprocessor
from mmencode.models.verified_preprocess import VerifiedPreprocessor, same_outputs

# The bench's tiny CLIP (bench/infinity/make_clip.py), OpenAI CLIP at 224 and 336, SigLIP at 224 and 384.
FIXED_SETTINGS: dict[str, Any] = {
    "clip-tiny-64": CLIPImageProcessorPil(size={"shortest_edge": 64}, crop_size={"height": 64, "width": 64}),
    "clip-224": CLIPImageProcessorPil(),
    "clip-336": CLIPImageProcessorPil(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336}),
    "siglip-224": SiglipImageProcessorPil(),
    "siglip-384": SiglipImageProcessorPil(size={"height": 384, "width": 384}),
}
# The mid bench checkpoint's processor (bench/checkpoints.py: 392x392 shrinks to 336x336) and the
# Qwen2-VL defaults (up to 28*28*1280 pixels: most images keep about their size).
DYNAMIC_SETTINGS: dict[str, Any] = {
    "qwen2-vl-mid": Qwen2VLImageProcessorPil(size={"shortest_edge": 56 * 56, "longest_edge": 336 * 336}),
    "qwen2-vl-defaults": Qwen2VLImageProcessorPil(),
}


def per_image_ms(run: Callable[[Image.Image], Any], images: list[Image.Image]) -> float:
    for image in images[:4]:
        run(image)
    started = time.perf_counter()
    for image in images:
        run(image)
    return (time.perf_counter() - started) / len(images) * 1000


def compare(
    name: str, fast_cls: type[VerifiedPreprocessor], processor: Any, images: list[Image.Image]
) -> dict[str, float]:
    """ms per image on both paths, once the fast one gave transformers' outputs for every image."""
    fast = fast_cls.verified(processor)
    if fast is None:
        raise SystemExit(f"{name}: the fast path did not verify against transformers")

    def reference(image: Image.Image) -> Mapping[str, torch.Tensor]:
        return processor(images=[image], return_tensors="pt")

    for image in images:
        got, expected = fast.outputs(image), reference(image)
        if not same_outputs(got, expected):
            raise SystemExit(f"{name}: outputs differ from transformers' on a {image.size} image")
    transformers_ms = per_image_ms(reference, images)
    fast_ms = per_image_ms(fast.outputs, images)
    return {
        "transformers_ms": round(transformers_ms, 3),
        "fast_ms": round(fast_ms, 3),
        "speedup": round(transformers_ms / fast_ms, 2),
    }


def decoded_jpegs(count: int, size: str) -> list[Image.Image]:
    width, height = (int(v) for v in size.split("x"))
    return [decode_image(jpeg, max_pixels=10**9) for jpeg in jpeg_images(count, width, height, seed=11)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--size", default="320x240", help="CLIP and SigLIP images")
    parser.add_argument("--qwen-sizes", default="392x392,640x480", help="Qwen2-VL images, comma-separated")
    args = parser.parse_args()
    images = decoded_jpegs(args.images, args.size)
    results: dict[str, Any] = {"image_size": args.size, "images": len(images)}
    for name, processor in FIXED_SETTINGS.items():
        results[name] = compare(name, FixedResolutionPreprocessor, processor, images)
    for size in args.qwen_sizes.split(","):
        images = decoded_jpegs(args.images, size)
        for name, processor in DYNAMIC_SETTINGS.items():
            results[f"{name} {size}"] = compare(name, DynamicResolutionPreprocessor, processor, images)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
