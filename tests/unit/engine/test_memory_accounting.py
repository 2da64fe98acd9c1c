"""The memory gauges tell the truth: what the response memo and the cache say they hold is what the
process holds for them, measured (tracemalloc for the memo's bytes, tensor storages for the rows)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import tracemalloc

import pytest
import torch

from mmencode.app.api.encode.response import render_encode_response
from mmencode.app.engine.cache import CachedEmbedding, LRUEmbeddingCache, ResponseMemo

ITEMS = 200


class _Result:
    """What the renderer reads of a scheduler result."""

    def __init__(self, index: int, rows: torch.Tensor) -> None:
        self.index, self.rows, self.hash = index, rows, f"{index:032x}"


def _answer(result: _Result) -> dict[str, object]:
    return {"id": "enc-1", "model": "m", "items": [{"index": result.index, "hash": result.hash}], "usage": {}}


@pytest.mark.parametrize(
    ("encoding_format", "dtype"),
    [("base64", "float32"), ("base64", "bfloat16"), ("float", "float32"), ("pt", "float16")],
)
def test_the_memo_holds_what_its_gauge_says(encoding_format: str, dtype: str) -> None:
    """Answers rendered as the service renders them: the memory the memo then holds is its ``nbytes``.

    orjson's output keeps the buffer it grew (6-12x a string's length), which the memo counted as the
    length: under traffic the process held 5-6x the memo's budget while the gauge said it was within it.
    """
    results = [_Result(i, torch.randn(64, 96, generator=torch.Generator().manual_seed(i))) for i in range(ITEMS)]
    memo = ResponseMemo(max_bytes=1 << 30)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for result in results:
            body = render_encode_response(
                _answer(result), [result], encoding_format=encoding_format, dtype=dtype, pooling="none", memo=memo
            )
            del body  # the answer is sent and gone; what the memo keeps stays
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(memo) == ITEMS
    # The payloads and each entry's bookkeeping (its key, weak reference, the LRU's links), within 10 %.
    assert abs(held - memo.nbytes) <= memo.nbytes * 0.1, (held, memo.nbytes)


def test_a_memo_entrys_bookkeeping_is_what_it_counts() -> None:
    """Small payloads, where the bookkeeping is most of an entry: ``ENTRY_OVERHEAD`` is what it costs."""
    rows = [torch.randn(4, 4) for _ in range(ITEMS * 20)]
    payloads = [b"x" * 100 for _ in rows]
    memo = ResponseMemo(max_bytes=1 << 30)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i, (item_rows, payload) in enumerate(zip(rows, payloads, strict=True)):
            memo.keep_payload(f"{i:032x}", item_rows, ("base64", "float32", "none"), payload)
        gc.collect()
        per_entry = (tracemalloc.get_traced_memory()[0] - before) / len(rows)
    finally:
        tracemalloc.stop()
    assert abs(per_entry - ResponseMemo.ENTRY_OVERHEAD) <= 0.2 * ResponseMemo.ENTRY_OVERHEAD, per_entry


_MEASURE_CACHE = """
import gc, json, torch
from mmencode.app.engine.cache import CachedEmbedding, LRUEmbeddingCache

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

cache = LRUEmbeddingCache(max_bytes=1 << 40)
source = torch.randn(16, 100)
gc.collect()
before = rss()
for i in range(40_000):
    cache.put(f"{i:032x}", CachedEmbedding(source.clone(), {"image_grid_thw": [1, 8, 8]}))
gc.collect()
print(json.dumps({"held": rss() - before, "counted": cache.nbytes}))
"""


def test_the_caches_gauge_is_what_the_process_holds_for_it() -> None:
    """Rows and each entry's bookkeeping (the tensor's, the metadata, the key, the LRU's links), against
    the resident memory of a fresh process (one that has freed nothing yet, so every entry is new memory):
    small rows, where the bookkeeping is a fifth of an entry."""
    run = subprocess.run([sys.executable, "-c", _MEASURE_CACHE], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    measured = json.loads(run.stdout)
    held, counted = measured["held"], measured["counted"]
    assert abs(held - counted) <= 0.1 * counted, (held, counted)


def test_the_cache_counts_the_storage_its_rows_keep_alive() -> None:
    """Rows that are a view of a larger tensor (a batch's output) pin all of it: the budget counts that."""
    batch = torch.zeros(1000, 64)  # 256,000 bytes
    view = CachedEmbedding(batch[:10], {})
    own = CachedEmbedding(batch[:10].clone(), {})
    assert own.nbytes == 10 * 64 * 4
    assert view.nbytes == 256_000
    cache = LRUEmbeddingCache(max_bytes=100_000)
    cache.put("view", view)  # over the budget on its own: not kept
    cache.put("own", own)
    assert len(cache) == 1 and cache.nbytes == own.nbytes + LRUEmbeddingCache.ENTRY_OVERHEAD
