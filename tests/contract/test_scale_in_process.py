"""One process at scale, over ASGI with the real tiny model: one encode for many identical requests, and
caches scoped per tenant (``TENANT:KEY`` entries, ``--cache-scope``)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import pytest

from tests.helpers import asgi_client, assert_error, data_uri, noise_image

KEYS = "acme:acme-key-1,acme:acme-key-2,bolt:bolt-key,lone-key"


def _auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def _metric(client: httpx.AsyncClient, sample: str) -> float:
    text = (await client.get("/metrics")).text
    match = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


async def test_32_concurrent_requests_for_one_new_image_cause_one_encode(checkpoints: dict[str, Path]) -> None:
    async with asgi_client(model=checkpoints["qwen2_vl"], cache_bytes=0) as client:
        body = {"items": [{"image": data_uri(noise_image(200, 150, seed=4242))}], "encoding_format": "float"}
        answers = await asyncio.gather(*(client.post("/v1/encode", json=body) for _ in range(32)))
        assert all(answer.status_code == 200 for answer in answers), answers[0].text
        items = [answer.json()["items"][0] for answer in answers]
        # With the cache off, every request that did not encode was answered from the one encode in flight.
        assert [item["source"] for item in items].count("encoder") == 1
        assert len({item["hash"] for item in items}) == 1
        assert all(item["embedding"]["data"] == items[0]["embedding"]["data"] for item in items)
        assert await _metric(client, 'mmencode_items_total{source="encoder"}') == 1
        assert await _metric(client, "mmencode_inflight_coalesced_total") == 31
        assert await _metric(client, "mmencode_batch_items_count") == 1


@pytest.fixture(scope="module")
def image() -> str:
    return data_uri(noise_image(96, 64, seed=777))


async def test_a_hash_answered_to_one_tenant_is_unknown_to_another(checkpoints: dict[str, Path], image: str) -> None:
    async with asgi_client(model=checkpoints["qwen2_vl"], api_key=KEYS) as client:
        first = await client.post("/v1/encode", json={"items": [{"image": image}]}, headers=_auth("acme-key-1"))
        assert first.status_code == 200, first.text
        content_hash = first.json()["items"][0]["hash"]
        by_hash = {"items": [{"hash": content_hash}]}
        # Another key of the same tenant shares its cache.
        same_tenant = await client.post("/v1/encode", json=by_hash, headers=_auth("acme-key-2"))
        assert same_tenant.status_code == 200 and same_tenant.json()["items"][0]["source"] == "cache"
        for other in ("bolt-key", "lone-key"):
            error = assert_error(
                await client.post("/v1/encode", json=by_hash, headers=_auth(other)), 400, "unknown_hash"
            )
            assert error["param"] == "items[0].hash"
        # Sent by the other tenant, the image is encoded for it, under the same content hash (vLLM's uuid).
        theirs = await client.post("/v1/encode", json={"items": [{"image": image}]}, headers=_auth("bolt-key"))
        assert theirs.json()["items"][0]["source"] == "encoder"
        assert theirs.json()["items"][0]["hash"] == content_hash
        again = await client.post("/v1/encode", json=by_hash, headers=_auth("bolt-key"))
        assert again.status_code == 200 and again.json()["items"][0]["source"] == "cache"


async def test_with_a_global_cache_scope_every_key_shares_the_rows(checkpoints: dict[str, Path], image: str) -> None:
    async with asgi_client(model=checkpoints["qwen2_vl"], api_key=KEYS, cache_scope="global") as client:
        first = await client.post("/v1/encode", json={"items": [{"image": image}]}, headers=_auth("acme-key-1"))
        by_hash = {"items": [{"hash": first.json()["items"][0]["hash"]}]}
        shared = await client.post("/v1/encode", json=by_hash, headers=_auth("bolt-key"))
        assert shared.status_code == 200, shared.text
        assert shared.json()["items"][0]["source"] == "cache"
        assert shared.json()["items"][0]["num_tokens"] == first.json()["items"][0]["num_tokens"]
