"""The response memo: payloads in their own byte budget, never served for other rows or variants."""

from __future__ import annotations

import gc
import sys

import torch

from mmencode.app.engine.cache import ResponseMemo

PAYLOAD = b"x" * 100
# What an entry of it holds: its bytes, the object's header, and the entry's own bookkeeping.
HELD = sys.getsizeof(PAYLOAD) + ResponseMemo.ENTRY_OVERHEAD
VARIANT = ("base64", "float32", "none")


def _rows(seed: int) -> torch.Tensor:
    return torch.randn(4, 16, generator=torch.Generator().manual_seed(seed))


def test_payloads_evict_the_least_recent_within_their_own_budget() -> None:
    memo = ResponseMemo(max_bytes=2 * HELD + 50)
    a, b, c = _rows(1), _rows(2), _rows(3)
    assert memo.keep_payload("a", a, VARIANT, PAYLOAD)
    assert memo.keep_payload("b", b, VARIANT, PAYLOAD)
    assert memo.payload("a", a, VARIANT) == PAYLOAD  # "a" is now the most recent
    assert memo.keep_payload("c", c, VARIANT, PAYLOAD)  # three do not fit: "b" goes
    assert memo.payload("b", b, VARIANT) is None
    assert memo.payload("a", a, VARIANT) == memo.payload("c", c, VARIANT) == PAYLOAD
    assert memo.nbytes == 2 * HELD and len(memo) == 2
    # A tensor payload (a safetensors answer's) counts its storage: 16 float32 values.
    assert memo.keep_payload("b", b, ("safetensors", "float32", "none"), b[:1].clone())
    assert memo.nbytes == HELD + 64 + ResponseMemo.ENTRY_OVERHEAD
    assert memo.payload("a", a, VARIANT) is None  # "a" made room


def test_a_tensor_payload_counts_the_whole_storage_it_keeps_alive() -> None:
    memo = ResponseMemo(max_bytes=100_000)
    rows = _rows(1)
    batch = torch.zeros(100, 16)  # 6,400 bytes; the payload is a view of two of its rows
    assert memo.keep_payload("a", rows, ("safetensors", "float16", "none"), batch[:2])
    assert memo.nbytes == 6_400 + ResponseMemo.ENTRY_OVERHEAD


def test_a_payload_over_the_budget_is_not_kept_and_zero_disables_the_memo() -> None:
    rows = _rows(1)
    assert not ResponseMemo(max_bytes=HELD - 1).keep_payload("a", rows, VARIANT, PAYLOAD)
    disabled = ResponseMemo(max_bytes=0)
    assert not disabled.keep_payload("a", rows, VARIANT, b"x")
    assert disabled.payload("a", rows, VARIANT) is None and disabled.nbytes == 0


def test_payloads_are_served_only_for_their_variant_and_their_rows() -> None:
    memo = ResponseMemo(max_bytes=10_000)
    rows = _rows(1)
    memo.keep_payload("a", rows, VARIANT, b'"f32"')
    assert memo.payload("a", rows, VARIANT) == b'"f32"'
    for other in (("base64", "float16", "none"), ("base64", "float32", "mean"), ("pt", "float32", "none")):
        assert memo.payload("a", rows, other) is None
    # Rows that are not the ones it was written from (an equal copy included) get nothing.
    assert memo.payload("a", rows.clone(), VARIANT) is None
    # Rows replaced under the same hash (another encode, a shared-tier value): their payload replaces the old.
    replacement = _rows(2)
    assert memo.keep_payload("a", replacement, VARIANT, b'"new"')
    assert memo.payload("a", replacement, VARIANT) == b'"new"' and memo.payload("a", rows, VARIANT) is None
    assert memo.nbytes == sys.getsizeof(b'"new"') + ResponseMemo.ENTRY_OVERHEAD


def test_a_payload_does_not_keep_its_rows_alive_and_goes_with_them() -> None:
    memo = ResponseMemo(max_bytes=10_000)
    rows, other = _rows(1), _rows(2)
    memo.keep_payload("a", rows, VARIANT, PAYLOAD)
    memo.keep_payload("b", other, VARIANT, PAYLOAD)
    del rows
    gc.collect()
    # Whatever rows now come under "a" are other rows: nothing is served for them, and the payload no
    # later answer can use no longer takes the budget.
    assert memo.payload("a", _rows(1), VARIANT) is None
    assert len(memo) == 1 and memo.nbytes == HELD
    assert memo.payload("b", other, VARIANT) == PAYLOAD
