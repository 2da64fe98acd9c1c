"""The response memo: payloads in their own byte budget, never served for other rows or variants."""

from __future__ import annotations

import gc

import torch

from mmencode.app.cache import ResponseMemo

PAYLOAD = b"x" * 100
VARIANT = ("base64", "float32", "none")


def _rows(seed: int) -> torch.Tensor:
    return torch.randn(4, 16, generator=torch.Generator().manual_seed(seed))


def test_payloads_evict_the_least_recent_within_their_own_budget() -> None:
    memo = ResponseMemo(max_bytes=250)
    a, b, c = _rows(1), _rows(2), _rows(3)
    assert memo.keep_payload("a", a, VARIANT, PAYLOAD)
    assert memo.keep_payload("b", b, VARIANT, PAYLOAD)
    assert memo.payload("a", a, VARIANT) == PAYLOAD  # "a" is now the most recent
    assert memo.keep_payload("c", c, VARIANT, PAYLOAD)  # 300 > 250: "b" goes
    assert memo.payload("b", b, VARIANT) is None
    assert memo.payload("a", a, VARIANT) == memo.payload("c", c, VARIANT) == PAYLOAD
    assert memo.nbytes == 200 and len(memo) == 2
    # A tensor payload (a safetensors answer's) counts its bytes.
    assert memo.keep_payload("b", b, ("safetensors", "float32", "none"), b[:1].clone())  # 64 bytes
    assert memo.nbytes == 264 - 100 and memo.payload("a", a, VARIANT) is None  # "a" made room


def test_a_payload_over_the_budget_is_not_kept_and_zero_disables_the_memo() -> None:
    rows = _rows(1)
    assert not ResponseMemo(max_bytes=99).keep_payload("a", rows, VARIANT, PAYLOAD)
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
    assert memo.nbytes == 5


def test_a_payload_does_not_keep_its_rows_alive() -> None:
    memo = ResponseMemo(max_bytes=10_000)
    rows = _rows(1)
    memo.keep_payload("a", rows, VARIANT, PAYLOAD)
    del rows
    gc.collect()
    # Whatever rows now come under "a" are other rows: nothing is served for them.
    assert memo.payload("a", _rows(1), VARIANT) is None
