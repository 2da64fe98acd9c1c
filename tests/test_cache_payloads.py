"""Wire payloads kept beside cached rows: one budget for both, never served for other rows or variants."""

from __future__ import annotations

import torch

from mmencode.app.cache import CachedEmbedding, LRUEmbeddingCache

ROWS_BYTES = 4 * 16 * 4  # a 4x16 float32 entry


def _entry(seed: int) -> CachedEmbedding:
    return CachedEmbedding(torch.randn(4, 16, generator=torch.Generator().manual_seed(seed)), {})


def test_payload_bytes_count_in_the_budget_and_evict_the_least_recent() -> None:
    cache = LRUEmbeddingCache(max_bytes=3 * ROWS_BYTES)
    a, b, c = _entry(1), _entry(2), _entry(3)
    for key, value in (("a", a), ("b", b), ("c", c)):
        cache.put(key, value)
    assert cache.nbytes == 3 * ROWS_BYTES and len(cache) == 3
    # A payload for "c" needs room: "a", the least recently used, goes, rows and all.
    assert cache.keep_payload("c", c.rows, ("base64", "float32", "none"), b"x" * 100)
    assert cache.nbytes == 2 * ROWS_BYTES + 100 <= cache.max_bytes
    assert cache.get("a") is None and cache.get("b") is b
    # "b" was just used: a tensor payload for it evicts "c" (with its payload) instead.
    assert cache.keep_payload("b", b.rows, ("safetensors", "float32", "mean"), b.rows.clone())
    assert cache.get("c") is None
    assert cache.nbytes == 2 * ROWS_BYTES
    assert cache.payload("b", b.rows, ("safetensors", "float32", "mean")) is not None


def test_a_payload_that_cannot_fit_is_not_kept() -> None:
    cache = LRUEmbeddingCache(max_bytes=ROWS_BYTES + 10)
    value = _entry(1)
    cache.put("a", value)
    assert not cache.keep_payload("a", value.rows, ("float", "float32", "none"), b"x" * 11)
    assert cache.nbytes == ROWS_BYTES and cache.get("a") is value
    assert cache.keep_payload("a", value.rows, ("float", "float32", "mean"), b"x" * 10)
    assert cache.nbytes == ROWS_BYTES + 10 == cache.max_bytes
    disabled = LRUEmbeddingCache(max_bytes=0)
    disabled.put("a", value)
    assert not disabled.keep_payload("a", value.rows, ("float", "float32", "mean"), b"x")
    assert disabled.nbytes == 0


def test_payloads_are_served_only_for_their_variant_and_their_rows() -> None:
    cache = LRUEmbeddingCache(max_bytes=10 * ROWS_BYTES)
    value = _entry(1)
    cache.put("a", value)
    cache.keep_payload("a", value.rows, ("base64", "float32", "none"), b'"f32"')
    assert cache.payload("a", value.rows, ("base64", "float32", "none")) == b'"f32"'
    for other in (("base64", "float16", "none"), ("base64", "float32", "mean"), ("pt", "float32", "none")):
        assert cache.payload("a", value.rows, other) is None
    # A payload is kept once per variant: the first stays.
    assert not cache.keep_payload("a", value.rows, ("base64", "float32", "none"), b'"other"')
    # Rows that are not the entry's (an equal copy included) get nothing, and give nothing.
    assert cache.payload("a", value.rows.clone(), ("base64", "float32", "none")) is None
    assert not cache.keep_payload("a", value.rows.clone(), ("float", "float32", "none"), b"[]")
    # The entry replaced (e.g. rows from the shared tier): its payloads go with the old rows.
    replacement = _entry(2)
    cache.put("a", replacement)
    assert cache.nbytes == ROWS_BYTES
    assert cache.payload("a", replacement.rows, ("base64", "float32", "none")) is None
    assert cache.payload("a", value.rows, ("base64", "float32", "none")) is None
