"""Decode + preprocess throughput on a thread pool vs a process pool, at 1 and 2 workers.

    python -m bench.preprocess --images 48 --size 1024x768

Uses Qwen2-VL's real image-processor defaults (a 1024x768 photo becomes ~2,000 patches), the
service's own ``decode_image``, and JPEGs like photos. The question it answers: does preprocessing
scale with cores on threads (PIL and numpy release the GIL), or does it need processes?
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor

from transformers import Qwen2VLImageProcessorPil

from bench.common import jpeg_images
from mmencode.app.media.image import decode_image

_PROCESSOR = Qwen2VLImageProcessorPil()  # the released checkpoints' defaults


def prepare(jpeg: bytes) -> int:
    image = decode_image(jpeg, max_pixels=10**9)
    out = _PROCESSOR(images=[image], return_tensors="pt")
    return int(out["pixel_values"].shape[0])


def measure(make_pool: Callable[[int], Executor], workers: int, jpegs: list[bytes]) -> float:
    with make_pool(workers) as pool:
        list(pool.map(prepare, jpegs[:workers]))  # start workers, import, warm caches
        started = time.perf_counter()
        list(pool.map(prepare, jpegs))
        return len(jpegs) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=48)
    parser.add_argument("--size", default="1024x768")
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    jpegs = jpeg_images(args.images, width, height, seed=7)
    started = time.perf_counter()
    patches = [prepare(j) for j in jpegs[:8]]
    single_ms = (time.perf_counter() - started) / 8 * 1000
    results = {"image_size": args.size, "patches_per_image": patches[0], "inline_ms_per_image": round(single_ms, 1)}
    for name, make_pool in (("threads", ThreadPoolExecutor), ("processes", ProcessPoolExecutor)):
        for workers in (1, 2):
            results[f"{name}_{workers}_images_per_s"] = round(measure(make_pool, workers, jpegs), 2)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
