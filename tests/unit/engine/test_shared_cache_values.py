"""The shared tier's value layout: what one replica writes, another reads back, and nothing else."""

from __future__ import annotations

import pytest
import safetensors.torch
import torch

from mmencode.app.engine.cache import CachedEmbedding
from mmencode.app.engine.cache.shared import decode_value, encode_value

METADATA = {"image_grid_thw": [1, 4, 6]}


def _value() -> CachedEmbedding:
    return CachedEmbedding(torch.randn(6, 64, generator=torch.Generator().manual_seed(0)), METADATA)


def test_float32_storage_round_trips_every_bit() -> None:
    value = _value()
    back = decode_value(encode_value(value, torch.float32))
    assert torch.equal(back.rows, value.rows) and back.metadata == METADATA
    assert back.rows.dtype == torch.float32


def test_bfloat16_storage_is_exact_for_a_bfloat16_model_and_rounds_float32_rows() -> None:
    value = _value()
    blob = encode_value(value, torch.bfloat16)
    assert len(blob) < len(encode_value(value, torch.float32)) * 0.6
    # Rows a bfloat16 model produced survive unchanged: the default stores in the model's dtype.
    from_bf16_model = CachedEmbedding(value.rows.bfloat16().float(), METADATA)
    assert torch.equal(decode_value(encode_value(from_bf16_model, torch.bfloat16)).rows, from_bf16_model.rows)
    # Float32 rows stored narrower come back rounded to bfloat16: what the README warns about.
    assert torch.equal(decode_value(blob).rows, value.rows.bfloat16().float())


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"\x00\x01 not an embedding",
        safetensors.torch.save({"x": torch.zeros(2, 2)}),  # someone else's safetensors
        safetensors.torch.save({"rows": torch.zeros(2, 2)}, metadata={"format": "mmencode-embedding", "version": "2"}),
    ],
    ids=["empty", "garbage", "foreign-safetensors", "future-version"],
)
def test_anything_else_is_refused_with_a_value_error(blob: bytes) -> None:
    with pytest.raises(ValueError):
        decode_value(blob)


def test_a_truncated_value_is_refused() -> None:
    blob = encode_value(_value(), torch.float32)
    with pytest.raises(ValueError):
        decode_value(blob[: len(blob) - 7])
