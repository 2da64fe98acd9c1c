"""Preprocessing: transformers' processors vs the service's verified fast paths, on both backends.

    python -m bench.fixed_preprocess --images 64 --size 320x240 --qwen-sizes 392x392,640x480

CLIP and SigLIP (``models/fixed_preprocess.py``) on ``--size`` images; the Qwen2-VL processor
(``models/dynamic_preprocess.py``, also Qwen2.5-VL's and Qwen3-VL's) on each of ``--qwen-sizes``; each
with its PIL processor and its torchvision one (``--backends``). Per image, on one thread, JPEGs
decoded by the service's own ``decode_image`` first (decoding is not timed). Every output of a fast path
is compared with transformers' (the same keys, dtypes and bits) before it is timed; the script stops on
any difference.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
from PIL import Image
from transformers import (
    CLIPImageProcessor,
    CLIPImageProcessorPil,
    Qwen2VLImageProcessor,
    Qwen2VLImageProcessorPil,
    SiglipImageProcessor,
    SiglipImageProcessorPil,
)

from bench.common import jpeg_images
from mmencode.app.media.image import decode_image
from mmencode.models.dynamic_preprocess import DynamicResolutionPreprocessor, TorchvisionDynamicResolutionPreprocessor
from mmencode.models.fixed_preprocess import FixedResolutionPreprocessor, TorchvisionFixedResolutionPreprocessor
from mmencode.models.verified_preprocess import VerifiedPreprocessor, same_outputs

# The bench's tiny CLIP (bench/infinity/make_clip.py), OpenAI CLIP at 224 and 336, SigLIP at 224 and 384:
# ({backend: processor class}, settings).
CLIP = {"pil": CLIPImageProcessorPil, "torchvision": CLIPImageProcessor}
SIGLIP = {"pil": SiglipImageProcessorPil, "torchvision": SiglipImageProcessor}
FIXED_SETTINGS: dict[str, tuple[dict[str, type], dict[str, Any]]] = {
    "clip-tiny-64": (CLIP, {"size": {"shortest_edge": 64}, "crop_size": {"height": 64, "width": 64}}),
    "clip-224": (CLIP, {}),
    "clip-336": (CLIP, {"size": {"shortest_edge": 336}, "crop_size": {"height": 336, "width": 336}}),
    "siglip-224": (SIGLIP, {}),
    "siglip-384": (SIGLIP, {"size": {"height": 384, "width": 384}}),
}
# The mid bench checkpoint's processor (bench/checkpoints.py: 392x392 shrinks to 336x336) and the
# Qwen2-VL defaults (up to 28*28*1280 pixels: most images keep about their size).
QWEN2_VL = {"pil": Qwen2VLImageProcessorPil, "torchvision": Qwen2VLImageProcessor}
DYNAMIC_SETTINGS: dict[str, tuple[dict[str, type], dict[str, Any]]] = {
    "qwen2-vl-mid": (QWEN2_VL, {"size": {"shortest_edge": 56 * 56, "longest_edge": 336 * 336}}),
    "qwen2-vl-defaults": (QWEN2_VL, {}),
}
FAST_PATHS: dict[str, dict[str, type[VerifiedPreprocessor]]] = {
    "fixed": {"pil": FixedResolutionPreprocessor, "torchvision": TorchvisionFixedResolutionPreprocessor},
    "dynamic": {"pil": DynamicResolutionPreprocessor, "torchvision": TorchvisionDynamicResolutionPreprocessor},
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
    parser.add_argument("--backends", default="pil,torchvision", help="pil, torchvision or both")
    args = parser.parse_args()
    # As the service's preprocessing threads run torch's ops (app/engine/threads.py): the torchvision
    # processors' float passes would otherwise take a second core that the fast paths do not.
    torch.set_num_threads(1)
    backends = args.backends.split(",")
    runs = [("fixed", FIXED_SETTINGS, args.size)]
    runs += [("dynamic", DYNAMIC_SETTINGS, size) for size in args.qwen_sizes.split(",")]
    results: dict[str, Any] = {"fixed_image_size": args.size, "images": args.images}
    for kind, settings, size in runs:
        images = decoded_jpegs(args.images, size)
        for name, (classes, kwargs) in settings.items():
            for backend in backends:
                label = f"{name} {size} {backend}"
                results[label] = compare(label, FAST_PATHS[kind][backend], classes[backend](**kwargs), images)
                print(label, json.dumps(results[label]), flush=True)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
