"""Overload soak: far more clients than the queue admits, good and hostile requests, clients that vanish.

    python -m bench.soak                       # about 10 minutes
    python -m bench.soak --duration 15 --short # what CI runs

Loopback only; bounded by ``--duration`` and ``--max-requests``. Reports requests sent, responses by
status, requests lost (connection errors) or hung (no answer within ``--hang-after``), the server's RSS
at start and end, whether the worker stayed up, and whether every good response's embedding equals
the reference computed before the load. Exits non-zero when any of those fails.

``--cluster`` runs the scale-out soak instead (bench/README.md, "Scale-out soak"): two image/video replicas
behind HAProxy sharing a real redis-server (leases, shared cache) and one encoder-cache directory with a
small byte budget, an audio replica beside them, API keys in two tenants, and mixed traffic at and over
capacity (images, video, audio, bursts of one new image, repeated hashes, hashes of the other tenant, bad
inputs, client disconnects) while Redis is restarted and one replica is killed and started again. Every
few seconds it samples each replica's RSS, fds and threads and its cache, memo and EC sizes; the report
(and ``--plot``) give their start, end and slope over the last half. Exits non-zero on an unexpected 5xx
(anything but 503 ``overloaded``/``not_ready``), a lost or hung answer, a wrong embedding, an answer naming
an EC file that is not there, a cross-tenant hash answered, or RSS growth of 5 % or more over the last half.

    python -m bench.soak --cluster --duration 600 --out bench/results/soak-cluster.json --plot bench/soak-cluster.png
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench import media
from bench.checkpoints import build_checkpoint
from bench.client import data_uri, decode_rows
from bench.common import jpeg_images, service_process
from mmencode.models.tiny import build_tiny

BAD_BODIES: list[tuple[str, Any]] = [
    ("invalid_image", {"items": [{"image": base64.b64encode(b"<html>no</html>").decode()}]}),
    ("truncated_png", {"items": [{"image": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB"}]}),
    ("schema", {"items": [], "dtype": "int4"}),
    ("unknown_hash", {"items": [{"hash": "f" * 32}]}),
    ("partial", None),  # built once the reference is known
    ("not_json", b"{]"),
]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


async def soak(url: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    jpegs = jpeg_images(args.images, 256, 192, seed=5)
    references: list[np.ndarray] = []
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        for jpeg in jpegs:
            response = await client.post("/v1/encode", json={"items": [{"image": data_uri(jpeg)}]})
            references.append(decode_rows(response.json()["items"][0]["embedding"]))
        given = {"precomputed_embedding": {"data": base64.b64encode(references[0].tobytes()).decode(),
                                           "shape": list(references[0].shape)}}  # fmt: skip
        bad = dict(BAD_BODIES)
        bad["partial"] = {"items": [given, {"image": data_uri(jpegs[1])}]}

    rss_start = rss_kib(pid)
    statuses: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    problems: list[str] = []
    mismatched = 0
    sent = 0
    deadline = time.monotonic() + args.duration
    rng = random.Random(0)
    limits = httpx.Limits(max_connections=args.concurrency * 2)

    async with httpx.AsyncClient(base_url=url, timeout=args.hang_after, limits=limits) as client:

        async def one() -> None:
            nonlocal sent, mismatched
            roll = rng.random()
            sent += 1
            if roll < 0.15:  # a client that gives up mid-request
                kinds["disconnect"] += 1
                index = rng.randrange(len(jpegs))
                try:
                    await client.post("/v1/encode", json={"items": [{"image": data_uri(jpegs[index])}]},
                                      timeout=rng.uniform(0.001, 0.05))  # fmt: skip
                    statuses["disconnect-answered"] += 1
                except httpx.TimeoutException:
                    statuses["disconnect"] += 1
                except httpx.HTTPError:
                    statuses["disconnect-reset"] += 1  # the aborted exchange's connection was dropped
                return
            if roll < 0.45:
                name, body = rng.choice(list(bad.items()))
                kinds[f"bad:{name}"] += 1
                request = {"content": body} if isinstance(body, bytes) else {"json": body}
            else:
                kinds["good"] += 1
                index = rng.randrange(len(jpegs))
                count = rng.choice([1, 1, 2, 4])
                request = {
                    "json": {"items": [{"image": data_uri(jpegs[(index + k) % len(jpegs)])} for k in range(count)]}
                }
            try:
                response = await client.post("/v1/encode", **request)
            except httpx.TimeoutException:
                statuses["hung"] += 1
                problems.append("hung request")
                return
            except httpx.HTTPError as exc:
                statuses["lost"] += 1
                problems.append(f"lost: {exc!r}")
                return
            statuses[str(response.status_code)] += 1
            body_json = response.json()
            if response.status_code >= 500 and response.status_code != 503:
                problems.append(f"{response.status_code}: {response.text[:200]}")
            if response.status_code != 200 and set(body_json) != {"error"}:
                problems.append(f"not the error shape: {response.text[:200]}")
            if response.status_code == 200 and "json" in request and "items" in request["json"]:
                for k, item in enumerate(body_json["items"]):
                    want = references[(index + k) % len(jpegs)]
                    if not np.allclose(decode_rows(item["embedding"]), want, atol=1e-4, rtol=0):
                        mismatched += 1

        async def user() -> None:
            while time.monotonic() < deadline and sent < args.max_requests:
                await one()

        await asyncio.gather(*(user() for _ in range(args.concurrency)))
        ready = (await client.get("/ready")).status_code

    rss_end = rss_kib(pid)
    ok = not problems and mismatched == 0 and ready == 200 and statuses["200"] > 0
    return {
        "ok": ok,
        "duration_s": args.duration,
        "concurrency": args.concurrency,
        "max_queue": args.max_queue,
        "requests_sent": sent,
        "kinds": dict(kinds),
        "responses_by_status": dict(statuses),
        "lost": statuses["lost"],
        "hung": statuses["hung"],
        "good_embeddings_mismatched": mismatched,
        "ready_at_end": ready,
        "rss_start_mib": round(rss_start / 1024, 1),
        "rss_end_mib": round(rss_end / 1024, 1),
        "problems": problems[:10],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    parser.add_argument("--max-requests", type=int, default=1_000_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-queue", type=int, default=8)
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--hang-after", type=float, default=60.0, help="a request unanswered this long is hung")
    parser.add_argument("--short", action="store_true", help="CI mode: smaller pool of images")
    parser.add_argument("--root", type=Path, default=Path(".cache/bench"))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--cluster", action="store_true", help="the scale-out soak (module docstring)")
    parser.add_argument("--cache-bytes", type=int, default=2 * 2**20, help="--cluster: each replica's cache")
    parser.add_argument("--memo-bytes", type=int, default=2**20, help="--cluster: each replica's memo")
    parser.add_argument("--ec-bytes", type=int, default=2**20, help="--cluster: the EC directory's budget")
    parser.add_argument("--ec-min-age", type=float, default=15.0, help="--cluster: --ec-min-age")
    parser.add_argument("--plot", type=Path, help="--cluster: a png of RSS and sizes over time")
    parser.add_argument("--table", type=Path, help="print the tables of a --cluster report (its --out file)")
    args = parser.parse_args(argv)
    if args.table:
        print(cluster_table(json.loads(args.table.read_text())))
        return 0
    if args.cluster:
        given = argv if argv is not None else sys.argv
        if "--concurrency" not in given:
            args.concurrency = 48  # over what two replicas' queues admit: some 503 overloaded is the point
        if "--max-queue" not in given:
            args.max_queue = 4
        return cluster_main(args)
    if args.short:
        args.images = min(args.images, 6)
    checkpoint = build_checkpoint("tiny", args.root)
    # Cache off: every good request must go through the queue and the encoder.
    options = ["--max-queue", str(args.max_queue), "--cache-bytes", "0", "--log-level", "warning"]
    options += ["--request-timeout", "30"]
    with service_process(checkpoint, *options) as (url, process):
        report = asyncio.run(soak(url, process.pid, args))
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


# ----- the scale-out soak (--cluster) -----
TENANT_KEYS = {"acme": "soak-acme-key", "globex": "soak-globex-key"}
EXPECTED_5XX_CODES = {"overloaded", "not_ready"}  # over capacity, or no replica ready: a client retries these
SAMPLE_EVERY_S = 5.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_port(port: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


def _proc(pid: int) -> dict[str, int]:
    """RSS (KiB), open fds and threads of ``pid``; zeros once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        fields = dict(line.split(":", 1) for line in status if ":" in line)
        return {
            "rss_kib": int(fields["VmRSS"].split()[0]),
            "threads": int(fields["Threads"]),
            "fds": len(os.listdir(f"/proc/{pid}/fd")),
        }
    except (OSError, KeyError, ValueError):
        return {"rss_kib": 0, "threads": 0, "fds": 0}


def _metric_values(text: str, names: Iterable[str]) -> dict[str, float]:
    wanted = set(names)
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in wanted:
            values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return values


def _dir_bytes(root: Path) -> tuple[int, int]:
    total = files = 0
    for file in root.glob("*/encoder_cache.safetensors"):
        with contextlib.suppress(FileNotFoundError):
            total += file.stat().st_size
            files += 1
    return total, files


class _Process:
    """A server process this soak starts, kills and starts again; its log goes to a file."""

    def __init__(self, name: str, command: list[str], log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.name, self.command, self.log_dir = name, command, log_dir
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **(env or {})}
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.url = ""  # a server's, where it has one

    @property
    def pid(self) -> int:
        return self.process.pid if self.process is not None and self.process.poll() is None else -1

    def start(self) -> None:
        self.starts += 1
        log = (self.log_dir / f"{self.name}.{self.starts}.log").open("wb")
        self.process = subprocess.Popen(self.command, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


def _wait_ready(url: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return
        time.sleep(0.3)
    raise TimeoutError(f"{url} not ready after {timeout}s")


def _percentiles(values: list[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return round(pick(0.5) * 1000, 1), round(pick(0.99) * 1000, 1)


def _slope_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of ``(seconds, value)``, per minute."""
    if len(points) < 2:
        return 0.0
    t = np.array([p[0] for p in points])
    v = np.array([p[1] for p in points])
    return float(np.polyfit(t, v, 1)[0] * 60)


class _Cluster:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.ec_dir = work / "ec"
        image_model = build_checkpoint("tiny", args.root)
        audio_model = args.root / "tiny-qwen2-audio"
        if not (audio_model / "config.json").is_file():
            build_tiny(audio_model, "qwen2_audio", overwrite=True)
        keys = ",".join(f"{tenant}:{key}" for tenant, key in TENANT_KEYS.items())
        redis_binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        self.redis_port = _free_port()
        self.redis = _Process(
            "redis",
            [redis_binary, "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"],
            work,
        )  # fmt: skip
        common = ["--host", "127.0.0.1", "--max-queue", str(args.max_queue), "--request-timeout", "30"]
        common += ["--log-level", "warning", "--api-key", keys]
        self.image_replicas = []
        for n in range(2):
            port = _free_port()
            command = [sys.executable, "-m", "mmencode", "serve", "--model", str(image_model), "--port", str(port)]
            command += [*common, "--shared-cache", f"redis://127.0.0.1:{self.redis_port}/0"]
            command += ["--cache-bytes", str(args.cache_bytes), "--response-memo-bytes", str(args.memo_bytes)]
            command += ["--ec-shared-storage", str(self.ec_dir), "--ec-storage-bytes", str(args.ec_bytes)]
            command += ["--ec-min-age", str(args.ec_min_age)]
            replica = _Process(f"image{n}", command, work, {"MMENCODE_CACHE_DIR": str(work / f"cache{n}")})
            replica.url = f"http://127.0.0.1:{port}"
            self.image_replicas.append(replica)
        port = _free_port()
        command = [sys.executable, "-m", "mmencode", "serve", "--model", str(audio_model), "--port", str(port)]
        command += [*common, "--cache-bytes", str(args.cache_bytes), "--response-memo-bytes", str(args.memo_bytes)]
        self.audio = _Process("audio", command, work, {"MMENCODE_CACHE_DIR": str(work / "cache-audio")})
        self.audio.url = f"http://127.0.0.1:{port}"
        self.lb_port = _free_port()
        servers = work / "replicas.cfg"
        lines = ["backend mmencode"]
        lines += [f"    server r{n} {r.url.removeprefix('http://')}" for n, r in enumerate(self.image_replicas)]
        servers.write_text("\n".join(lines) + "\n")
        policy = Path(__file__).resolve().parents[1] / "deploy" / "haproxy" / "haproxy.cfg"
        haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
        self.haproxy = _Process(
            "haproxy",
            [haproxy, "-f", str(policy), "-f", str(servers), "-db"],
            work,
            {"MMENCODE_LB_BIND": f"127.0.0.1:{self.lb_port}", "MMENCODE_LB_STATS_BIND": f"127.0.0.1:{_free_port()}"},
        )
        self.lb_url = f"http://127.0.0.1:{self.lb_port}"

    def start(self) -> None:
        self.redis.start()
        _wait_port(self.redis_port)
        for replica in [*self.image_replicas, self.audio]:
            replica.start()
        for replica in [*self.image_replicas, self.audio]:
            _wait_ready(replica.url)
        self.haproxy.start()
        _wait_port(self.lb_port)
        # Both replicas up in HAProxy's eyes (rise 2 after checks every 2 s).
        time.sleep(5)

    def stop(self) -> None:
        for process in [self.haproxy, *self.image_replicas, self.audio, self.redis]:
            process.stop()


async def cluster_soak(cluster: _Cluster, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(1)
    lb, audio_url = cluster.lb_url, cluster.audio.url
    auth = {tenant: {"Authorization": f"Bearer {key}"} for tenant, key in TENANT_KEYS.items()}
    # Each tenant its own pool: globex never sends acme's images, so acme's hashes must be unknown to it.
    pools = {"acme": jpeg_images(16, 128, 96, seed=11), "globex": jpeg_images(8, 128, 96, seed=12)}
    clips = [media.clip(8, 64, 64, fps=4, seed=s) for s in range(3)]
    sounds = [media.wav(media.tone(1.0 + 0.5 * s, 16000, seed=s), 16000) for s in range(3)]
    fmt = {"encoding_format": "base64"}
    references: dict[tuple[str, str, int], np.ndarray] = {}
    hashes: dict[str, list[str]] = {"acme": [], "globex": []}
    async with httpx.AsyncClient(timeout=120) as client:
        for tenant, pool in pools.items():
            for n, jpeg in enumerate(pool):
                body = {"items": [{"image": data_uri(jpeg)}], **fmt}
                item = (await client.post(lb + "/v1/encode", json=body, headers=auth[tenant])).json()["items"][0]
                references[(tenant, "image", n)] = decode_rows(item["embedding"])
                hashes[tenant].append(item["hash"])
        for n, clip in enumerate(clips):
            body = {"items": [{"video": media.video_data_uri(clip)}], **fmt}
            response = await client.post(lb + "/v1/encode", json=body, headers=auth["acme"])
            references[("acme", "video", n)] = decode_rows(response.json()["items"][0]["embedding"])
        for n, sound in enumerate(sounds):
            body = {"items": [{"audio": media.audio_data_uri(sound)}], **fmt}
            response = await client.post(audio_url + "/v1/encode", json=body, headers=auth["acme"])
            references[("acme", "audio", n)] = decode_rows(response.json()["items"][0]["embedding"])
    bad = dict(BAD_BODIES)
    bad["partial"] = {"items": [{"image": data_uri(pools["acme"][0])}, {"image": "data:image/png;base64,AAAA"}]}
    bad["unsupported_modality"] = {"items": [{"audio": media.audio_data_uri(sounds[0])}]}

    outcomes: Counter[tuple[str, str]] = Counter()  # (kind, status or status:code)
    latencies: dict[str, list[float]] = {}
    problems: list[str] = []
    counts = Counter[str]()
    samples: list[dict[str, Any]] = []
    events: list[tuple[float, str]] = []
    started = time.monotonic()
    deadline = started + args.duration
    fresh_seed = iter(range(10_000, 10**9))

    def fresh_image() -> bytes:
        return jpeg_images(1, 96 + rng.randrange(4) * 16, 80, seed=next(fresh_seed))[0]

    def problem(text: str) -> None:
        counts["problems"] += 1
        if len(problems) < 40:
            problems.append(f"{time.monotonic() - started:.0f}s {text}")

    def check_answer(
        kind: str, response: httpx.Response, tenant: str, expect: list[tuple[str, str, int] | None]
    ) -> None:
        items = response.json()["items"]
        if len(items) != len(expect):
            problem(f"{kind}: {len(items)} items for {len(expect)}")
            return
        for item, key in zip(items, expect, strict=True):
            if key is not None and not np.allclose(decode_rows(item["embedding"]), references[key], atol=1e-4, rtol=0):
                counts["wrong_embeddings"] += 1
                problem(f"{kind}: wrong rows for {key}")
            path = item.get("ec_cache_path")
            if path is not None and not Path(path).is_file():
                counts["ec_file_missing"] += 1
                problem(f"{kind}: the answer names {path}, which is not there")
            counts["ec_named" if path is not None else "ec_null"] += kind not in {"audio"}

    async def send(
        client: httpx.AsyncClient, kind: str, url: str, tenant: str, body: Any, give_up: float | None = None
    ) -> httpx.Response | None:
        request: dict[str, Any] = {"content": body} if isinstance(body, bytes) else {"json": body}
        began = time.monotonic()
        try:
            response = await client.post(
                url + "/v1/encode", headers=auth[tenant], timeout=give_up or args.hang_after, **request
            )
        except httpx.TimeoutException:
            if give_up is not None:
                outcomes[(kind, "gave up")] += 1
            else:
                outcomes[(kind, "hung")] += 1
                problem(f"{kind}: hung")
            return None
        except httpx.HTTPError as exc:
            if give_up is not None:
                outcomes[(kind, "gave up")] += 1
            else:
                outcomes[(kind, "lost")] += 1
                problem(f"{kind}: lost: {exc!r}")
            return None
        elapsed = time.monotonic() - began
        code = ""
        if response.status_code != 200:
            try:
                code = response.json()["error"]["code"] or ""
            except (ValueError, KeyError, TypeError):
                problem(f"{kind}: {response.status_code} not in the error shape: {response.text[:120]}")
        label = str(response.status_code) + (f":{code}" if code else "")
        outcomes[(kind, label)] += 1
        if response.status_code == 200:
            latencies.setdefault(kind, []).append(elapsed)
        elif response.status_code >= 500 and not (response.status_code == 503 and code in EXPECTED_5XX_CODES):
            counts["unexpected_5xx"] += 1
            problem(f"{kind}: {label}: {response.text[:160]}")
        return response

    limits = httpx.Limits(max_connections=args.concurrency * 8, max_keepalive_connections=args.concurrency * 2)
    async with httpx.AsyncClient(timeout=args.hang_after, limits=limits) as client:

        async def one() -> None:
            roll = rng.random()
            tenant = "acme" if rng.random() < 0.7 else "globex"
            pool = pools[tenant]
            if roll < 0.10:  # a client that gives up after 1-50 ms (half of them straight to a replica: HAProxy
                # does not pass a client's abort on, so behind it the replica finishes the work anyway)
                body = {"items": [{"image": data_uri(rng.choice([fresh_image(), pool[0]]))}], **fmt}
                target = rng.choice([lb, cluster.image_replicas[0].url])
                await send(client, "disconnect", target, tenant, body, give_up=rng.uniform(0.001, 0.05))
            elif roll < 0.28:
                name, body = rng.choice(list(bad.items()))
                response = await send(client, f"bad:{name}", lb, tenant, body)
                if response is not None and response.status_code == 200:
                    problem(f"bad:{name} answered 200")
            elif roll < 0.50:  # known images: repeated hashes, answered from the caches or encoded again
                picks = [rng.randrange(len(pool)) for _ in range(rng.choice([1, 1, 2, 3]))]
                body = {"items": [{"image": data_uri(pool[n])} for n in picks], **fmt}
                response = await send(client, "image", lb, tenant, body)
                if response is not None and response.status_code == 200:
                    check_answer("image", response, tenant, [(tenant, "image", n) for n in picks])
            elif roll < 0.58:  # by hash: its own (answered, or unknown_hash once evicted everywhere)
                n = rng.randrange(len(hashes[tenant]))
                body = {"items": [{"hash": hashes[tenant][n]}], **fmt}
                response = await send(client, "own hash", lb, tenant, body)
                if response is not None and response.status_code == 200:
                    check_answer("own hash", response, tenant, [(tenant, "image", n)])
            elif roll < 0.63:  # the other tenant's hash: must be unknown_hash, never its rows
                body = {"items": [{"hash": rng.choice(hashes["acme"])}], **fmt}
                response = await send(client, "acme's hash as globex", lb, "globex", body)
                if response is not None and response.status_code == 200:
                    counts["tenant_leaks"] += 1
                    problem("globex was answered acme's rows")
            elif roll < 0.67:  # a burst of one new image: a shared system-prompt image, client retries
                image = fresh_image()
                body = {"items": [{"image": data_uri(image)}], **fmt}
                answers = await asyncio.gather(*(send(client, "burst", lb, "acme", body) for _ in range(8)))
                rows = [decode_rows(r.json()["items"][0]["embedding"]) for r in answers if r and r.status_code == 200]
                if any(not np.array_equal(rows[0], other) for other in rows[1:]):
                    counts["wrong_embeddings"] += 1
                    problem("burst: different rows for one image")
            elif roll < 0.77:
                n = rng.randrange(len(clips))
                body = {"items": [{"video": media.video_data_uri(clips[n])}], **fmt}
                response = await send(client, "video", lb, "acme", body)
                if response is not None and response.status_code == 200:
                    check_answer("video", response, "acme", [("acme", "video", n)])
            elif roll < 0.86:
                n = rng.randrange(len(sounds))
                body = {"items": [{"audio": media.audio_data_uri(sounds[n])}], **fmt}
                response = await send(client, "audio", audio_url, "acme", body)
                if response is not None and response.status_code == 200:
                    check_answer("audio", response, "acme", [("acme", "audio", n)])
            else:  # new content: a new cache entry and a new EC file
                body = {"items": [{"image": data_uri(fresh_image())}], **fmt}
                response = await send(client, "new image", lb, tenant, body)
                if response is not None and response.status_code == 200:
                    check_answer("new image", response, tenant, [None])

        async def user() -> None:
            while time.monotonic() < deadline:
                await one()

        async def sample() -> None:
            names = ["mmencode_cache_bytes", "mmencode_response_memo_bytes", "mmencode_ec_storage_bytes"]
            async with httpx.AsyncClient(timeout=5) as probe:
                while time.monotonic() < deadline + SAMPLE_EVERY_S / 2:
                    row: dict[str, Any] = {"t": round(time.monotonic() - started, 1), "load1": os.getloadavg()[0]}
                    for replica in [*cluster.image_replicas, cluster.audio]:
                        row[replica.name] = _proc(replica.pid) if replica.pid > 0 else None
                        try:
                            text = (await probe.get(replica.url + "/metrics")).text
                            row[replica.name + ":metrics"] = _metric_values(text, names)
                        except httpx.HTTPError:
                            row[replica.name + ":metrics"] = None
                    row["ec_dir"] = _dir_bytes(cluster.ec_dir)
                    row["requests"] = sum(outcomes.values())
                    samples.append(row)
                    await asyncio.sleep(SAMPLE_EVERY_S)

        async def faults() -> None:
            victim = cluster.image_replicas[1]
            await asyncio.sleep(args.duration * 0.15)
            events.append((time.monotonic() - started, f"kill -9 {victim.name}"))
            victim.kill()
            await asyncio.sleep(10)
            victim.start()
            events.append((time.monotonic() - started, f"{victim.name} started again"))
            await asyncio.sleep(args.duration * 0.30 - (time.monotonic() - started))
            events.append((time.monotonic() - started, "redis-server killed"))
            cluster.redis.kill()
            await asyncio.sleep(5)
            cluster.redis.start()
            events.append((time.monotonic() - started, "redis-server started again (empty)"))

        await asyncio.gather(sample(), faults(), *(user() for _ in range(args.concurrency)))
        ready = {
            r.name: (await client.get(r.url + "/ready")).status_code for r in [*cluster.image_replicas, cluster.audio]
        }
        finals: dict[str, dict[str, float]] = {}
        counters = [
            "mmencode_inflight_coalesced_total", "mmencode_shared_lease_total", "mmencode_ec_storage_evictions_total",
            "mmencode_ec_cache_writes_total", "mmencode_client_disconnects_total", "mmencode_items_total",
        ]  # fmt: skip
        for replica in [*cluster.image_replicas, cluster.audio]:
            text = (await client.get(replica.url + "/metrics", timeout=10)).text
            finals[replica.name] = _metric_values(text, counters)
            finals[replica.name + ":labelled"] = {
                line.split(" ")[0]: float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith(("mmencode_shared_lease_total{", "mmencode_ec_cache_writes_total{"))
            }
    return _cluster_report(args, cluster, outcomes, latencies, counts, problems, samples, events, ready, finals)


def _cluster_report(
    args: argparse.Namespace,
    cluster: _Cluster,
    outcomes: Counter[tuple[str, str]],
    latencies: dict[str, list[float]],
    counts: Counter[str],
    problems: list[str],
    samples: list[dict[str, Any]],
    events: list[tuple[float, str]],
    ready: dict[str, int],
    finals: dict[str, dict[str, float]],
) -> dict[str, Any]:
    half = args.duration / 2
    processes: dict[str, Any] = {}
    rss_ok = True
    for replica in [*cluster.image_replicas, cluster.audio]:
        rows = [(s["t"], s[replica.name]) for s in samples if s.get(replica.name) and s[replica.name]["rss_kib"]]
        last_half = [(t, p) for t, p in rows if t >= half]
        entry: dict[str, Any] = {"starts": replica.starts}
        for field_name in ("rss_kib", "fds", "threads"):
            scale = field_name == "rss_kib"  # RSS in MiB
            unit = (lambda v: round(v / 1024, 1)) if scale else (lambda v: v)
            if rows:
                entry["rss_mib" if scale else field_name] = {
                    "start": unit(rows[0][1][field_name]),
                    "half": unit(last_half[0][1][field_name]) if last_half else None,
                    "end": unit(rows[-1][1][field_name]),
                    "max": unit(max(p[field_name] for _, p in rows)),
                    "slope_last_half_per_min": round(
                        _slope_per_min([(t, p[field_name]) for t, p in last_half]) / (1024 if scale else 1), 2
                    ),
                }
        if len(last_half) >= 6:
            first = np.mean([p["rss_kib"] for _, p in last_half[:3]])
            last = np.mean([p["rss_kib"] for _, p in last_half[-3:]])
            entry["rss_growth_last_half_pct"] = round(float((last - first) / first * 100), 2)
            rss_ok = rss_ok and entry["rss_growth_last_half_pct"] < 5
        processes[replica.name] = entry
    sizes: dict[str, Any] = {}
    for name, budget in (("mmencode_cache_bytes", args.cache_bytes), ("mmencode_response_memo_bytes", args.memo_bytes)):
        for replica in [*cluster.image_replicas, cluster.audio]:
            values = [s[replica.name + ":metrics"].get(name, 0) for s in samples if s.get(replica.name + ":metrics")]
            if values:
                sizes[f"{name} {replica.name}"] = {"max": max(values), "end": values[-1], "budget": budget}
    ec = [s["ec_dir"][0] for s in samples]
    sizes["ec_dir_bytes"] = {
        "max": max(ec),
        "end": ec[-1],
        "budget": args.ec_bytes,
        "files_end": samples[-1]["ec_dir"][1],
    }
    by_kind: dict[str, dict[str, int]] = {}
    for (kind, label), n in sorted(outcomes.items()):
        by_kind.setdefault(kind, {})[label] = n
    lat = {
        kind: dict(zip(("p50_ms", "p99_ms"), _percentiles(values), strict=True)) for kind, values in latencies.items()
    }
    every = [v for values in latencies.values() for v in values]
    lat["all 200"] = dict(zip(("p50_ms", "p99_ms"), _percentiles(every), strict=True))
    lost = sum(n for (_, label), n in outcomes.items() if label in {"lost", "hung"})
    ok = (
        counts["unexpected_5xx"] == 0
        and lost == 0
        and counts["wrong_embeddings"] == 0
        and counts["ec_file_missing"] == 0
        and counts["tenant_leaks"] == 0
        and rss_ok
        and all(status == 200 for status in ready.values())
        and sizes["ec_dir_bytes"]["max"] <= args.ec_bytes
    )
    loads = [s["load1"] for s in samples]
    return {
        "ok": ok,
        "duration_s": args.duration,
        "concurrency": args.concurrency,
        "cpus": os.cpu_count(),
        "load_average_1m": {
            "min": round(min(loads), 2),
            "median": round(float(np.median(loads)), 2),
            "max": round(max(loads), 2),
        },
        "requests": sum(outcomes.values()),
        "by_kind": by_kind,
        "latency_200": lat,
        "unexpected_5xx": counts["unexpected_5xx"],
        "lost_or_hung": lost,
        "wrong_embeddings": counts["wrong_embeddings"],
        "ec_file_missing": counts["ec_file_missing"],
        "ec_named": counts["ec_named"],
        "ec_null": counts["ec_null"],
        "tenant_leaks": counts["tenant_leaks"],
        "ready_at_end": ready,
        "processes": processes,
        "sizes": sizes,
        "counters_end": finals,
        "events": [(round(t, 1), text) for t, text in events],
        "problems": problems,
        "samples": samples,
    }


def plot_cluster(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = report["samples"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for name in report["processes"]:
        points = [(s["t"], s[name]["rss_kib"] / 1024) for s in samples if s.get(name) and s[name]["rss_kib"]]
        top.plot([p[0] for p in points], [p[1] for p in points], label=f"{name} RSS")
    top.set_ylabel("RSS (MiB)")
    top.axvline(report["duration_s"] / 2, color="grey", linestyle=":", label="last half starts")
    for t, text in report["events"]:
        top.axvline(t, color="red", alpha=0.3)
        top.annotate(text, (t, top.get_ylim()[0]), rotation=90, fontsize=7, va="bottom")
    top.legend(fontsize=8)
    top.set_title(
        f"scale-out soak: {report['requests']} requests, "
        f"load average {report['load_average_1m']['median']} on {report['cpus']} cores"
    )
    times = [s["t"] for s in samples]
    bottom.plot(times, [s["ec_dir"][0] / 1024 for s in samples], label="EC directory")
    bottom.axhline(report["sizes"]["ec_dir_bytes"]["budget"] / 1024, color="C0", linestyle="--", label="EC budget")
    for name in report["processes"]:
        values = [
            (s["t"], s[name + ":metrics"].get("mmencode_cache_bytes", 0) / 1024)
            for s in samples
            if s.get(name + ":metrics")
        ]
        bottom.plot([v[0] for v in values], [v[1] for v in values], label=f"{name} cache")
    cache_budget = next(v["budget"] for k, v in report["sizes"].items() if k.startswith("mmencode_cache_bytes"))
    bottom.axhline(cache_budget / 1024, color="grey", linestyle="--", label="cache budget (each)")
    bottom.set_ylabel("KiB")
    bottom.set_xlabel("seconds")
    bottom.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def cluster_main(args: argparse.Namespace) -> int:
    # Kept afterwards: the servers' logs (a 500 names its request id there) and the EC directory.
    work = Path(tempfile.mkdtemp(prefix="mmencode-soak-"))
    cluster = _Cluster(args, work)
    try:
        cluster.start()
        report = asyncio.run(cluster_soak(cluster, args))
    finally:
        cluster.stop()
    report["command"] = " ".join(["python -m bench.soak", *sys.argv[1:]])
    report["work_dir"] = str(work)
    summary = {k: v for k, v in report.items() if k != "samples"}
    print(json.dumps(summary, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
    if args.plot:
        plot_cluster(report, args.plot)
    return 0 if report["ok"] else 1


def cluster_table(report: dict[str, Any]) -> str:
    """The report's figures as bench/README.md shows them (markdown)."""
    lines = ["| requests | by status |", "| --- | --- |"]
    for kind, statuses in report["by_kind"].items():
        lines.append(f"| {kind} | " + ", ".join(f"{label}: {n:,}" for label, n in statuses.items()) + " |")
    lines += ["", "| answered 200 | p50 ms | p99 ms |", "| --- | --- | --- |"]
    for kind, figures in report["latency_200"].items():
        lines.append(f"| {kind} | {figures['p50_ms']} | {figures['p99_ms']} |")
    lines += [
        "",
        "| process | starts | RSS MiB start / at half / end (max) | RSS slope, last half | RSS growth, last half "
        "| fds start / end (max) | threads start / end (max) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, entry in report["processes"].items():
        rss, fds, threads = entry["rss_mib"], entry["fds"], entry["threads"]
        lines.append(
            f"| {name} | {entry['starts']} | {rss['start']} / {rss['half']} / {rss['end']} ({rss['max']}) "
            f"| {rss['slope_last_half_per_min']} MiB/min | {entry.get('rss_growth_last_half_pct', '-')} % "
            f"| {fds['start']} / {fds['end']} ({fds['max']}) "
            f"| {threads['start']} / {threads['end']} ({threads['max']}) |"
        )
    lines += ["", "| size | max | end | budget |", "| --- | --- | --- | --- |"]
    for name, entry in report["sizes"].items():
        extra = f" ({entry['files_end']} files at the end)" if "files_end" in entry else ""
        lines.append(f"| {name} | {entry['max']:,.0f} | {entry['end']:,.0f}{extra} | {entry['budget']:,} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
