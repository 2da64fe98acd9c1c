"""Real-size towers on one GPU: bare forward, the service at concurrency 64 on 1080p JPEGs, where the time goes.

    python -m bench.gpu --out gpu.json                   # one GPU, 16 cores: ~5-7 minutes, tower builds included
    python -m bench.gpu --tiny --device cpu               # tiny depths and widths, end to end on a CPU: ~1.5 min

Towers (bench/towers.py, random weights from the released configs, nothing downloaded): Qwen2.5-VL-7B's
vision tower, SigLIP-so400m, InternViT-300M with InternVL3-8B's projector. For each, in this order:

- **preprocessing**: decode + the checkpoint's image processor on one thread, per 1080p JPEG, in this process,
  on each image processor backend: PIL and torchvision on the CPU (the service's preprocessing threads, one
  core each), and torchvision on the device (transformers' ``device=``: the pixels go up as uint8 and are
  resized and normalised there), with the largest difference of its pixel values from the CPU's.
- **bare**: ``adapter.forward`` on preprocessed images (host-to-device, the tower, rows back to the host),
  bf16 on CUDA / fp32 on CPU, at each of the tower's batch sizes for ``--bare-seconds``; the best one counts.
- **transport**: one image's response as the service builds it (``embedding_payload`` + JSON) and as a
  client reads it (JSON + base64 + ``numpy.frombuffer``), with its size in bytes.
- **service**: ``mmencode serve --model DIR`` (cache off), driven with one 1080p JPEG per request at
  ``--concurrency`` for about ``--duration`` seconds (``--max-requests`` at most), cycling ``--images``
  distinct JPEGs (with the cache off a repeat costs what a new image does). Its /metrics give the encoder's
  busy time, images per forward, queue wait and request time over exactly that window.

Ceilings per image (img/s): encoder = bare; preprocessing = preprocess workers (the service's default:
the CPU count) / decode+preprocess time; response = 1 / response-encoding time (the route builds it on
the event loop, one core). "bound" names the lowest: what the service's images/s should approach.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import io
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import torch
from PIL import Image

from bench.client import data_uri, decode_rows
from bench.common import drive, jpeg_images, service
from bench.server_times import ServerTimes
from bench.towers import TOWERS, build_tower
from mmencode.app.engine.engine import resolve_device
from mmencode.app.engine.threads import SerialTorchThreadPool
from mmencode.app.media.image import decode_image
from mmencode.app.wire.encodings import embedding_payload
from mmencode.app.wire.json import dumps_json
from mmencode.models import load_encoder
from mmencode.models.base import EncoderAdapter, PreparedItem

_MAX_PIXELS = 10**9
# Bounds of a run: one GPU and 16 cores (about 1.5 minutes a tower), or --tiny on a CPU (about 20 s a tower).
_FULL = {"concurrency": 64, "duration": 30.0, "max_requests": 4000, "images": 256, "bare_seconds": 2.0}
_FULL["preprocess_images"] = 8
_TINY = {"concurrency": 8, "duration": 5.0, "max_requests": 32, "images": 8, "bare_seconds": 0.5}
_TINY["preprocess_images"] = 3


# ----- inputs -----


def photo_jpegs(count: int, width: int, height: int, *, seed: int = 0, workers: int | None = None) -> list[bytes]:
    """``count`` distinct photo-like JPEGs of ``width`` x ``height``, fast enough for hundreds at 1080p.

    ``bench.common.jpeg_images`` computes its texture per pixel (about a second per 1080p image here);
    these upscale a few of its small images and shift each copy by its own offset, so every file is
    different while the texture and the JPEG size stay photo-like.
    """
    bases = [
        np.asarray(Image.open(io.BytesIO(small)).resize((width, height), Image.Resampling.BICUBIC))
        for small in jpeg_images(min(count, 8), max(1, width // 4), max(1, height // 4), seed=seed)
    ]

    def one(index: int) -> bytes:
        pixels = np.roll(bases[index % len(bases)], (index * 7 % height, index * 13 % width), axis=(0, 1))
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
        return buffer.getvalue()

    with ThreadPoolExecutor(workers or os.cpu_count()) as pool:
        return list(pool.map(one, range(count)))


# ----- in-process phases -----


def measure_preprocessing(adapter: EncoderAdapter, jpegs: Sequence[bytes]) -> dict[str, Any]:
    """Decode and preprocess each JPEG on this thread; means in ms, and the processor's rows per image."""
    adapter.preprocess(decode_image(jpegs[0], max_pixels=_MAX_PIXELS))  # first-call costs
    decode_s, preprocess_s, rows = [], [], set()
    for jpeg in jpegs:
        started = time.perf_counter()
        image = decode_image(jpeg, max_pixels=_MAX_PIXELS)
        decoded = time.perf_counter()
        prepared = adapter.preprocess(image)
        _synchronize(prepared.tensors["pixel_values"].device)  # on-device preprocessing is asynchronous
        decode_s.append(decoded - started)
        preprocess_s.append(time.perf_counter() - decoded)
        rows.add(prepared.num_tokens)
    return {
        "decode_ms": round(statistics.fmean(decode_s) * 1000, 2),
        "preprocess_ms": round(statistics.fmean(preprocess_s) * 1000, 2),
        "rows_per_image": sorted(rows),
    }


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _OnDevice:
    """A torchvision image processor that runs on ``device``: every call passes transformers' ``device=``."""

    def __init__(self, processor: Any, device: torch.device) -> None:
        self._processor, self._device = processor, device

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._processor(*args, device=self._device, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._processor, name)


def _adapter_with(adapter: EncoderAdapter, processor: Any, backend: str) -> EncoderAdapter:
    """``adapter``'s tower (shared, not copied) behind another image processor, its fast paths re-verified."""
    return type(adapter)(
        adapter.module,
        processor,
        adapter.config,
        checkpoint=adapter.checkpoint,
        device=adapter.device,
        dtype=adapter.dtype,
        fingerprint=adapter.fingerprint,
        processor_config=adapter.processor_config,
        image_processor_backend=backend,  # type: ignore[arg-type]
    )


def measure_backends(adapter: EncoderAdapter, jpegs: Sequence[bytes]) -> dict[str, Any]:
    """Decode + preprocess per image on each backend, on one serial thread as the service's pool runs it.

    ``torchvision-device`` (CUDA only) keeps its pixels on the device, as a forward would take them; its
    ``max_abs_diff`` is against torchvision on the CPU for the same images (resampling on another device).
    """
    variants: dict[str, EncoderAdapter] = {}
    for backend in ("pil", "torchvision"):
        processor = type(adapter).build_processor(adapter.processor_config, backend)
        variants[backend] = _adapter_with(adapter, processor, backend)
    if adapter.device.type == "cuda":
        on_device = _OnDevice(variants["torchvision"].processor, adapter.device)
        variants["torchvision-device"] = _adapter_with(adapter, on_device, "torchvision")
    with SerialTorchThreadPool(1) as pool:
        out = {name: pool.submit(measure_preprocessing, variant, jpegs).result() for name, variant in variants.items()}
        if "torchvision-device" in variants:
            image = decode_image(jpegs[0], max_pixels=_MAX_PIXELS)
            on_cpu = pool.submit(variants["torchvision"].preprocess, image).result().tensors["pixel_values"]
            on_gpu = pool.submit(variants["torchvision-device"].preprocess, image).result().tensors["pixel_values"]
            out["torchvision-device"]["max_abs_diff"] = float((on_gpu.float().cpu() - on_cpu.float()).abs().max())
    return out


def measure_bare(
    adapter: EncoderAdapter, prepared: Sequence[PreparedItem], batch_sizes: Sequence[int], seconds: float
) -> dict[str, Any]:
    """Images/s of ``adapter.forward`` at each batch size, each run for about ``seconds`` after a warm-up."""
    per_batch: dict[int, float] = {}
    for size in batch_sizes:
        batch = [prepared[i % len(prepared)] for i in range(size)]
        try:
            adapter.forward(batch)  # warm-up: kernels picked, memory pooled
            _synchronize(adapter.device)
            forwards, started = 0, time.perf_counter()
            while forwards < 2 or time.perf_counter() - started < seconds:
                adapter.forward(batch)  # returns rows on the host: synchronous
                forwards += 1
            per_batch[size] = forwards * size / (time.perf_counter() - started)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            if not per_batch:
                raise
            break  # larger batches will not fit either
    best = max(per_batch, key=lambda size: per_batch[size])
    return {
        "images_per_s_by_batch": {size: round(rate, 2) for size, rate in per_batch.items()},
        "best_batch": best,
        "images_per_s": round(per_batch[best], 2),
    }


def measure_transport(rows: torch.Tensor, encoding_format: str, dtype: str, repeats: int = 3) -> dict[str, Any]:
    """One image's response: bytes, server time to build it, client time to read the rows back."""
    build_s, read_s = [], []
    body = b""
    for _ in range(repeats):
        started = time.perf_counter()
        payload = embedding_payload(rows, encoding_format=encoding_format, dtype=dtype)
        body = dumps_json({"items": [{"index": 0, "num_tokens": rows.shape[0], "embedding": payload}]})
        built = time.perf_counter()
        decoded = decode_rows(orjson.loads(body)["items"][0]["embedding"])
        read_s.append(time.perf_counter() - built)
        build_s.append(built - started)
        assert decoded.shape == tuple(rows.shape)
    return {
        "response_bytes": len(body),
        "server_encode_ms": round(min(build_s) * 1000, 2),
        "client_decode_ms": round(min(read_s) * 1000, 2),
    }


def in_process(
    directory: Path,
    name: str,
    jpegs: Sequence[bytes],
    device: torch.device,
    args: argparse.Namespace,
) -> dict[str, Any]:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    adapter = load_encoder(directory, device=device, dtype=dtype)
    try:
        out: dict[str, Any] = {
            "dtype": str(dtype).removeprefix("torch."),
            "parameters_m": round(sum(p.numel() for p in adapter.module.parameters()) / 1e6, 3),
            "width": adapter.hidden_size,
        }
        # The service's own backend (``auto``: torchvision where it imports) sets its preprocessing ceiling.
        out["preprocessing_by_backend"] = measure_backends(adapter, jpegs[: args.preprocess_images])
        out["preprocessing"] = out["preprocessing_by_backend"][adapter.image_processor_backend]
        prepared = [adapter.preprocess(decode_image(j, max_pixels=_MAX_PIXELS)) for j in jpegs[:4]]
        if args.batch_sizes:
            batch_sizes = [int(v) for v in args.batch_sizes.split(",")]
        else:  # a tiny tower on a CPU peaks at small batches; its larger ones only cost time
            batch_sizes = list(TOWERS[name].batch_sizes[: 3 if args.tiny else None])
        out["bare"] = measure_bare(adapter, prepared, batch_sizes, args.bare_seconds)
        rows = adapter.forward(prepared[:1]).rows
        out["transport"] = measure_transport(rows, args.encoding_format, args.response_dtype)
        return out
    finally:
        del adapter
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


# ----- the service -----


def measure_service(
    directory: Path, jpegs: Sequence[bytes], device: torch.device, args: argparse.Namespace
) -> dict[str, Any]:
    options = {"encoding_format": args.encoding_format, "dtype": args.response_dtype}
    bodies = [{"items": [{"image": data_uri(jpeg)}], **options} for jpeg in jpegs]
    flags = ["--cache-bytes", "0", "--max-queue", "100000", "--request-timeout", "600", "--log-level", "warning"]
    flags += ["--device", str(device), *args.serve_args]
    with service(directory, *flags) as url:
        probe = httpx.post(url + "/v1/encode", json=bodies[0], timeout=600)
        probe.raise_for_status()
        item = probe.json()["items"][0]
        # A first round at full concurrency warms the pools and gives the rate the run is sized by.
        warm = asyncio.run(drive(url, "/v1/encode", bodies[: args.concurrency], args.concurrency))
        count = int(min(args.max_requests, max(2 * args.concurrency, warm.images_per_s * args.duration)))
        run_bodies = [bodies[i % len(bodies)] for i in range(count)]
        before = httpx.get(url + "/metrics").text
        cpu_started = time.process_time()
        result = asyncio.run(drive(url, "/v1/encode", run_bodies, args.concurrency))
        client_cpu_s = time.process_time() - cpu_started
        after = httpx.get(url + "/metrics").text
    times = ServerTimes.between(before, after)
    summary = result.summary()
    summary.update(
        requests=count,
        seconds=round(result.seconds, 2),
        num_tokens=item["num_tokens"],
        embedding_shape=item["embedding"]["shape"],
        encoder_busy=round(times.encoder_s_total / result.seconds, 3),
        encoder_ms_per_image=round(times.encoder_s_total / max(1, result.images) * 1000, 2),
        loadgen_cpu=round(client_cpu_s / result.seconds, 3),  # cores the load generator used
        server=times.as_dict(),
    )
    return summary


# ----- the table -----


def ceilings(result: dict[str, Any], preprocess_workers: int) -> dict[str, float]:
    """Images/s each stage would allow alone (see the module docstring)."""
    prep = result["preprocessing"]
    prep_ms = prep["decode_ms"] + prep["preprocess_ms"]
    return {
        "encoder": result["bare"]["images_per_s"],
        "preprocessing": round(preprocess_workers * 1000 / prep_ms, 1),
        "response": round(1000 / max(result["transport"]["server_encode_ms"], 1e-3), 1),
    }


COLUMNS = (
    "tower", "params M", "rows/img", "width", "bare img/s (batch)", "service img/s", "svc/bare", "p50 ms",
    "p99 ms", "decode+prep ms", "encoder ms/img", "img/forward", "queue ms", "request ms", "resp MB",
    "resp build ms", "client read ms", "loadgen cores", "bound",
)  # fmt: skip


def table_rows(results: dict[str, Any]) -> list[list[str]]:
    rows = []
    workers = results["preprocess_workers"]
    for name, r in results["towers"].items():
        svc, bare, prep, transport = r["service"], r["bare"], r["preprocessing"], r["transport"]
        limits = ceilings(r, workers)
        bound = min(limits, key=lambda stage: limits[stage])
        rows.append([
            name, f"{r['parameters_m']:.3g}", str(svc["num_tokens"]), str(r["width"]),
            f"{bare['images_per_s']:.1f} ({bare['best_batch']})", f"{svc['images_per_s']:.1f}",
            f"{svc['images_per_s'] / bare['images_per_s']:.2f}", f"{svc['p50_ms']:.0f}", f"{svc['p99_ms']:.0f}",
            f"{prep['decode_ms'] + prep['preprocess_ms']:.1f}", f"{svc['encoder_ms_per_image']:.1f}",
            f"{svc['server']['images_per_forward']:.1f}", f"{svc['server']['queue_wait_s'] * 1000:.0f}",
            f"{svc['server']['request_s'] * 1000:.0f}", f"{transport['response_bytes'] / 1e6:.2f}",
            f"{transport['server_encode_ms']:.1f}", f"{transport['client_decode_ms']:.1f}", f"{svc['loadgen_cpu']:.2f}",
            f"{bound} ({limits[bound]:.0f}/s)",
        ])  # fmt: skip
    return rows


def format_table(results: dict[str, Any]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(results)]
    return "\n".join(lines)


BACKEND_COLUMNS = ("tower", "backend", "decode ms", "preprocess ms", "img/s per core", "max abs diff vs CPU")


def format_backend_table(results: dict[str, Any]) -> str:
    """Decode + preprocess per 1080p JPEG on each image processor backend, one thread."""
    lines = ["| " + " | ".join(BACKEND_COLUMNS) + " |", "|" + " --- |" * len(BACKEND_COLUMNS)]
    for name, tower in results["towers"].items():
        for backend, prep in tower["preprocessing_by_backend"].items():
            per_core = 1000 / (prep["decode_ms"] + prep["preprocess_ms"])
            diff = f"{prep['max_abs_diff']:.3g}" if "max_abs_diff" in prep else ""
            cells = [name, backend, f"{prep['decode_ms']:.1f}", f"{prep['preprocess_ms']:.1f}", f"{per_core:.1f}", diff]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", help="torch device for both phases (default: cuda if any)")
    parser.add_argument("--tiny", action="store_true", help="tiny depths and widths, real processors (CPU smoke run)")
    parser.add_argument("--towers", default=",".join(TOWERS), help=f"comma-separated subset of {list(TOWERS)}")
    parser.add_argument("--root", type=Path, default=Path(".cache/bench/gpu"), help="where towers are saved")
    parser.add_argument("--concurrency", type=int, help="concurrent requests (64; --tiny: 8)")
    parser.add_argument("--duration", type=float, help="seconds of measured service load per tower (30; --tiny: 5)")
    parser.add_argument("--max-requests", type=int, help="cap on a service run's requests (4000; --tiny: 32)")
    parser.add_argument("--images", type=int, help="distinct JPEGs, cycled (256; --tiny: 8)")
    parser.add_argument("--image-size", default="1920x1080")
    parser.add_argument("--bare-seconds", type=float, help="per batch size (2; --tiny: 0.5)")
    parser.add_argument(
        "--batch-sizes", help="images per forward for the bare phase (default: per tower; --tiny: its first three)"
    )
    parser.add_argument("--preprocess-images", type=int, help="images timed one by one (8; --tiny: 3)")
    parser.add_argument("--encoding-format", default="base64", choices=["base64", "pt", "npy", "float"])
    parser.add_argument(
        "--response-dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"],
        help="rows' dtype on the wire (bfloat16: what the tower computes on CUDA, half of float32's bytes)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    parser.add_argument("serve_args", nargs="*", help="extra `mmencode serve` flags, after --")
    args = parser.parse_args(argv)
    for name, value in (_TINY if args.tiny else _FULL).items():
        if getattr(args, name) is None:  # flags given explicitly win
            setattr(args, name, value)

    started = time.perf_counter()
    device = resolve_device(args.device)
    width, height = (int(v) for v in args.image_size.split("x"))
    jpegs = photo_jpegs(args.images, width, height)
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "cpus": os.cpu_count(),
        "preprocess_workers": _preprocess_workers(args.serve_args),
        "tiny": args.tiny,
        "image_size": args.image_size,
        "jpeg_kb": round(statistics.fmean(len(j) for j in jpegs) / 1000, 1),
        "concurrency": args.concurrency,
        "encoding_format": args.encoding_format,
        "response_dtype": args.response_dtype,
        "towers": {},
    }
    for name in args.towers.split(","):
        step = time.perf_counter()
        directory = build_tower(name, args.root, tiny=args.tiny, dtype=torch.float32 if args.tiny else torch.bfloat16)
        built = time.perf_counter() - step
        result = in_process(directory, name, jpegs, device, args)
        result["service"] = measure_service(directory, jpegs, device, args)
        result["build_s"] = round(built, 1)
        result["seconds"] = round(time.perf_counter() - step, 1)
        results["towers"][name] = result
        print(name, json.dumps(result), file=sys.stderr, flush=True)
        if args.out:  # what a run cut short by its time limit still has
            args.out.write_text(json.dumps(results, indent=2))
    results["seconds"] = round(time.perf_counter() - started, 1)
    print(format_table(results))
    print()
    print(format_backend_table(results))
    setting = f"{args.image_size} JPEGs ({results['jpeg_kb']} KB), concurrency {args.concurrency}"
    wire = f"{args.encoding_format} {args.response_dtype}"
    print(f"{results['device']}, {results['cpus']} CPUs, {setting}, {wire}; {results['seconds']} s", flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    return results


def _preprocess_workers(serve_args: Sequence[str]) -> int:
    """The service's preprocessing threads: ``--preprocess-workers`` if passed through, else its default."""
    for i, flag in enumerate(serve_args):
        if flag == "--preprocess-workers" and i + 1 < len(serve_args):
            return int(serve_args[i + 1])
        if flag.startswith("--preprocess-workers="):
            return int(flag.split("=", 1)[1])
    return max(1, os.cpu_count() or 1)


if __name__ == "__main__":
    main()
