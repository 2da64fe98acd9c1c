"""mmencode against SGLang's own ``--encoder-only`` server, both driven by SGLang's encoder protocol.

    .venv/bin/python -m bench.vs_sglang [--models tiny,mid,qwen2_5_vl,qwen3_vl] [--sizes 448x448,1280x720]
        [--concurrency 1,8,32] [--requests 96] [--rounds 2] [--out FILE]

As a language-only SGLang server drives an encoder (``zmq_to_tokenizer``): a ZMQ PULL socket on loopback,
and per image one ``POST /encode`` with SGLang's body (``mm_items: [data URI]``, ``embedding_port`` that
socket's port); a request is done when its rows have been pushed there, and its latency is the time to the
last pushed byte. SGLang 0.5.23 runs from ``.venv-sglang`` with the CPU flags and shims of
``bench/peers/sglang`` (float32, ``--encoder-transfer-backend zmq_to_tokenizer``); mmencode from this
venv with ``--sglang-dtype float32``. Both at ``--log-level warning`` (neither pays for a log line per
request) and otherwise their defaults; both serve the same servable checkpoint directory
(``bench/checkpoints.py``: ``tiny`` Qwen2-VL, the ``mid`` tower in a Qwen2-VL, tiny Qwen2.5-VL and Qwen3-VL)
and both preprocess with the torchvision image processor (SGLang's, and mmencode's on SGLang's route).

Per model, size and concurrency: ``--rounds`` rounds; each round a set of ``--requests`` fresh JPEGs that
no server has seen in this run, sent to each side in turn (bench/head_to_head.py). Reported per side:
images/s, p50/p99 latency, CPU seconds per image (the server's whole process tree, from /proc), and as
checks, the rows' shapes per image (which must agree) and, on the warm-up images, the largest difference
between the two sides' rows. Prints one markdown table and writes the JSON under bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson

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
from bench.sglang_client import Push, PushReceiver, encode_body

SIDES = ("sglang", "mmencode")
_JSON = {"content-type": "application/json"}
_WARM_IMAGES = 16


class EncoderSide:
    """One encoder server and SGLang's client of it: post ``/encode``, wait for the rows on the receiver."""

    def __init__(self, name: str, url: str, pid: int, receiver: PushReceiver, session: aiohttp.ClientSession) -> None:
        self.name, self.url, self.pid = name, url, pid
        self._receiver, self._session = receiver, session
        self.shapes: dict[str, tuple[int, ...]] = {}  # image -> rows' shape
        self.keep_rows = False
        self.rows: dict[str, np.ndarray] = {}

    async def send(self, index: int, image: str) -> float:
        started, push = await self.exchange(image)
        return push.arrived - started

    async def exchange(self, image: str) -> tuple[float, Push]:
        """Post the image; when it was sent, and its push."""
        body = encode_body(image, self._receiver.port, self.url)
        data = orjson.dumps(body)
        arrival = self._receiver.expect(body["req_id"])
        started = time.perf_counter()
        try:
            async with self._session.post(self.url + "/encode", data=data, headers=_JSON) as response:
                answer = await response.read()
                if response.status != 200:
                    raise RuntimeError(f"/encode answered {response.status}: {answer[:300]!r}")
            push = await asyncio.wait_for(arrival, 120)
        finally:
            self._receiver.forget(body["req_id"])
        if push.error is not None:
            raise RuntimeError(push.error)
        assert push.shape is not None
        self.shapes[image] = push.shape
        if self.keep_rows:
            self.rows[image] = push.array()
        return started, push


@contextlib.contextmanager
def servers(checkpoint: Path, logs: Path) -> Iterator[dict[str, tuple[str, int]]]:
    """SGLang's encoder and mmencode on the checkpoint, started together: {side: (url, pid)}."""
    from bench.peers.sglang.server import sglang_server  # the harness the tests use, shims and flags

    def sglang() -> Any:
        manager = sglang_server(
            checkpoint, logs / "sglang.log", role="encoder", transport="zmq_to_tokenizer",
            extra=["--log-level", "warning"],
        )  # fmt: skip
        return manager, manager.__enter__()

    def mmencode() -> Any:
        manager = service_process(checkpoint, "--sglang-dtype", "float32", "--log-level", "warning")
        return manager, manager.__enter__()

    with contextlib.ExitStack() as stack, ThreadPoolExecutor(max_workers=2) as starter:
        started = [starter.submit(sglang), starter.submit(mmencode)]
        entered = []
        for future in started:
            manager, value = future.result()
            entered.append(value)
            stack.push(manager.__exit__)
        sglang_server_, (mmencode_url, mmencode_process) = entered
        yield {
            "sglang": (sglang_server_.url, sglang_server_.process.pid),
            "mmencode": (mmencode_url, mmencode_process.pid),
        }


async def measure_model(
    urls: dict[str, tuple[str, int]],
    sizes: Sequence[tuple[int, int]],
    concurrencies: Sequence[int],
    requests: int,
    rounds: int,
    images_root: Path,
) -> dict[str, Any]:
    receiver = PushReceiver()
    results: dict[str, Any] = {}
    timeout = aiohttp.ClientTimeout(total=600)
    # A connection per request, as SGLang's language server opens a client session per /encode call
    # (receiver.py, MMReceiverHTTP.encode); it also never meets a keep-alive the server just closed.
    connector = aiohttp.TCPConnector(force_close=True, limit=0)
    async with receiver.running(), aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        sides = [EncoderSide(name, *urls[name], receiver, session) for name in SIDES]
        for size in sizes:
            label = f"{size[0]}x{size[1]}"
            # Warm-up (first forwards allocate, per shape), and the check that both compute the same rows.
            warm = image_set(images_root, size, _WARM_IMAGES, seed=42_999)
            for side in sides:
                side.keep_rows = True
                await asyncio.gather(*(side.exchange(image) for image in warm))
                side.keep_rows = False
            difference = max(float(np.abs(sides[0].rows[i] - sides[1].rows[i]).max()) for i in warm)
            for side in sides:
                side.rows.clear()
            for concurrency in concurrencies:
                sets = [
                    image_set(images_root, size, requests, seed=43_000 + 1000 * concurrency + r) for r in range(rounds)
                ]
                tallies = await interleaved(sides, sets, concurrency, on_round=progress(label, concurrency))
                mismatched = sum(
                    sides[0].shapes.get(image) != sides[1].shapes.get(image)
                    for image_list in sets
                    for image in image_list
                )
                results[f"{label} c={concurrency}"] = {
                    "size": label,
                    "concurrency": concurrency,
                    **{name: tally.summary() for name, tally in tallies.items()},
                    "rows_shape": list(sides[1].shapes.get(sets[0][0], ())),
                    "shape_mismatches": mismatched,
                    "max_row_difference_warmup": difference,
                }
                for side in sides:
                    side.shapes.clear()
    receiver.close()
    return results


def table(results: dict[str, Any]) -> str:
    lines = [
        "| model | image | C | SGLang img/s | mmencode img/s | ratio (per round) | SGLang p50 / p99 ms | "
        "mmencode p50 / p99 ms | p99 ratio | CPU s/img SGLang / mmencode | errors |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for model, settings in results["models"].items():
        for row in settings.values():
            theirs, ours = row["sglang"], row["mmencode"]
            lines.append(
                f"| {model} | {row['size']} | {row['concurrency']} | {theirs['images_per_s']:.1f} | "
                f"{ours['images_per_s']:.1f} | {ratio_cell(ours, theirs)} | "
                f"{theirs['p50_ms']:.0f} / {theirs['p99_ms']:.0f} | "
                f"{ours['p50_ms']:.0f} / {ours['p99_ms']:.0f} | {ours['p99_ms'] / theirs['p99_ms']:.2f} | "
                f"{theirs['cpu_s_per_image']:.4f} / {ours['cpu_s_per_image']:.4f} | "
                f"{theirs['errors'] + ours['errors'] + row['shape_mismatches']} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(SERVABLE_KINDS), help=f"of {', '.join(SERVABLE_KINDS)}")
    add_matrix_arguments(parser, name="vs_sglang")
    args = parser.parse_args(argv)
    from bench.peers.sglang.server import SGLANG_VENV

    if not (SGLANG_VENV / ".installed").is_file():
        sys.exit(f"{SGLANG_VENV} is missing: build it with `make sglang-env`")

    sizes, concurrencies = sizes_of(args.sizes), [int(c) for c in args.concurrency.split(",")]
    results: dict[str, Any] = {"meta": run_meta(), "requests": args.requests, "rounds": args.rounds, "models": {}}
    for model in args.models.split(","):
        checkpoint = servable_checkpoint(model, args.root.resolve())
        print(f"{model}: starting SGLang's encoder and mmencode on {checkpoint}", flush=True)
        with tempfile.TemporaryDirectory(prefix=f"vs-sglang-{model}-") as logs, servers(checkpoint, Path(logs)) as urls:
            results["models"][model] = asyncio.run(
                measure_model(urls, sizes, concurrencies, args.requests, args.rounds, args.root / "images")
            )
    path = write_results("vs_sglang", results, args.out)
    meta = results["meta"]
    print(f"\n`{meta['command']}` at {meta['commit']}, {meta['started_utc']}, load {meta['load_average_at_start']} "
          f"-> {meta['load_average_at_end']}; JSON: {path}\n")  # fmt: skip
    print(table(results))


if __name__ == "__main__":
    main()
