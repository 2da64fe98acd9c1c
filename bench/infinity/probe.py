"""Send image-embedding requests to a running Infinity server on loopback and print what comes back.

Usage: python bench/infinity/probe.py [BASE_URL] [MODEL_ID]
       (defaults: http://127.0.0.1:7997, the first id listed by GET /models)

Only the standard library is used, so any python3 runs it. Images are sent inline as data URIs
(``data:image/png;base64,...``); Infinity refuses loopback/private URLs by default anyway.
"""

from __future__ import annotations

import base64
import json
import struct
import sys
import time
import urllib.error
import urllib.request
import zlib


def png_bytes(width: int = 128, height: int = 96, seed: int = 0) -> bytes:
    """A small RGB PNG made without PIL (deterministic pseudo-random pixels)."""
    state = seed * 2654435761 + 1
    rows = bytearray()
    for _ in range(height):
        rows.append(0)  # filter: none
        for _ in range(width * 3):
            state = (state * 1103515245 + 12345) & 0x7FFFFFFF
            rows.append(state >> 23)

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(bytes(rows))) + chunk(b"IEND", b"")
    )


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def call(base: str, path: str, body: dict | None = None) -> tuple[int, dict | str, float]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            raw, status = resp.read(), resp.status
    except urllib.error.HTTPError as err:
        raw, status = err.read(), err.code
    ms = (time.perf_counter() - t0) * 1000
    try:
        return status, json.loads(raw), ms
    except ValueError:
        return status, raw.decode(errors="replace"), ms


def summarize(payload: dict | str) -> str:
    if not isinstance(payload, dict) or "data" not in payload:
        return json.dumps(payload)[:300] if isinstance(payload, dict) else str(payload)[:300]
    rows = payload["data"]
    emb = rows[0]["embedding"]
    dim = len(emb) if isinstance(emb, list) else f"base64 str len {len(emb)}"
    head = emb[:4] if isinstance(emb, list) else emb[:24]
    keys = sorted(payload)
    return f"keys={keys} n={len(rows)} row_keys={sorted(rows[0])} dim={dim} head={head} usage={payload.get('usage')}"


def main() -> None:
    base = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:7997"
    status, models, _ = call(base, "/models")
    model = sys.argv[2] if len(sys.argv) > 2 else models["data"][0]["id"]
    print("GET /models ->", status, [m["id"] for m in models["data"]], models["data"][0].get("capabilities"))
    img1, img2 = data_uri(png_bytes(seed=1)), data_uri(png_bytes(seed=2))
    cases = [
        ("/embeddings", {"model": model, "input": [img1], "modality": "image"}),
        ("/embeddings", {"model": model, "input": [img1, img2], "modality": "image", "encoding_format": "float"}),
        ("/embeddings", {"model": model, "input": img1, "modality": "image"}),
        ("/embeddings", {"model": model, "input": [img1], "modality": "image", "encoding_format": "base64"}),
        ("/embeddings_image", {"model": model, "input": [img1]}),
        ("/embeddings", {"model": model, "input": ["a photo of a cat"]}),
        ("/embeddings", {"model": model, "input": ["a photo of a cat"], "modality": "text"}),
        ("/embeddings", {"model": model, "input": ["http://127.0.0.1:1/x.png"], "modality": "image"}),
        ("/embeddings", {"model": model, "input": ["data:image/png;base64,AAAA"], "modality": "image"}),
    ]
    for path, body in cases:
        shown = {
            k: (v if k != "input" else f"<{len(v) if isinstance(v, list) else 1} item(s)>") for k, v in body.items()
        }
        status, payload, ms = call(base, path, body)
        print(f"POST {path} {json.dumps(shown)} -> {status} in {ms:.1f} ms: {summarize(payload)}")
    # latency of one single-image request, warm
    times = []
    for i in range(20):
        status, payload, ms = call(
            base, "/embeddings", {"model": model, "input": [data_uri(png_bytes(seed=10 + i))], "modality": "image"}
        )
        assert status == 200, payload
        times.append(ms)
    times.sort()
    print(f"20 sequential 1-image requests: median {times[10]:.1f} ms, min {times[0]:.1f} ms, max {times[-1]:.1f} ms")


if __name__ == "__main__":
    main()
