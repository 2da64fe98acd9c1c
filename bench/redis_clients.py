"""redis-py's asyncio client (with hiredis) vs valkey-glide on the shared cache's access pattern:
one MGET of a request's keys, values the size of an item's rows. Loopback, sequential, bounded.

    python -m bench.redis_clients --value-bytes 202936 --keys 4 --rounds 2000

valkey-glide is not a dependency: install it into a scratch venv with redis to run this.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

import redis.asyncio as aioredis

from bench.common import percentile, redis_server


async def _redis_py(url: str, keys: list[str], rounds: int) -> list[float]:
    client = aioredis.Redis.from_url(url)
    timings = []
    for _ in range(rounds):
        started = time.perf_counter()
        values = await client.mget(keys)
        timings.append(time.perf_counter() - started)
        assert all(values)
    await client.aclose()
    return timings


async def _glide(url: str, keys: list[str], rounds: int) -> list[float]:
    from glide import GlideClient, GlideClientConfiguration, NodeAddress  # type: ignore[import-not-found]

    host, port = url.split("//")[1].split("/")[0].split(":")
    client = await GlideClient.create(GlideClientConfiguration([NodeAddress(host, int(port))]))
    timings = []
    for _ in range(rounds):
        started = time.perf_counter()
        values = await client.mget(list(keys))
        timings.append(time.perf_counter() - started)
        assert all(values)
    await client.close()
    return timings


async def _run(args: argparse.Namespace, url: str) -> dict[str, object]:
    client = aioredis.Redis.from_url(url)
    keys = [f"bench:{i}" for i in range(args.keys)]
    for key in keys:
        await client.set(key, os.urandom(args.value_bytes))
    await client.aclose()
    results: dict[str, object] = {"value_bytes": args.value_bytes, "keys_per_mget": args.keys}
    for name, run in (("redis-py+hiredis", _redis_py), ("valkey-glide", _glide)):
        await run(url, keys, 50)  # warm up
        timings = await run(url, keys, args.rounds)
        results[name] = {f"p{q}_us": round(percentile(timings, q) * 1e6) for q in (50, 90, 99)}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--value-bytes", type=int, default=202936)
    parser.add_argument("--keys", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    with redis_server() as url:
        print(json.dumps(asyncio.run(_run(args, url)), indent=2))


if __name__ == "__main__":
    main()
