"""The memory gauges tell the truth: what the response memo and the cache say they hold is what the
process holds for them, measured (tracemalloc for the memo's bytes, tensor storages for the rows)."""

from __future__ import annotations

import gc
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
    # The memo's own bookkeeping (its dict, keys, weak references) is a few hundred bytes an entry, beside
    # payloads of 10-40 KB.
    assert memo.nbytes <= held <= memo.nbytes * 1.1 + ITEMS * 600, (held, memo.nbytes)


def test_a_payload_goes_when_its_rows_are_evicted_from_the_cache() -> None:
    """The memo keeps payloads only for rows something still holds: evicted rows free their payloads too."""
    cache = LRUEmbeddingCache(max_bytes=10 * 64 * 96 * 4)
    memo = ResponseMemo(max_bytes=1 << 30)
    for i in range(30):
        result = _Result(i, torch.randn(64, 96))
        cache.put(result.hash, CachedEmbedding(result.rows, {}))
        render_encode_response(
            _answer(result), [result], encoding_format="base64", dtype="float32", pooling="none", memo=memo
        )
        del result
    gc.collect()
    assert len(cache) == 10
    assert len(memo) == 10  # the payloads of the 20 evicted rows are gone with them


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
    assert len(cache) == 1 and cache.nbytes == own.nbytes
