"""--ec-dtype auto: connector files in the dtype the encoder computes in, so a consumer computing in the
same dtype gets exactly the rows mmencode answers with (vLLM converts any file's dtype without a word)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers import data_uri, live_server, noise_image, rows_of


@pytest.mark.parametrize(("ec_dtype", "expected"), [(None, torch.float32), ("bfloat16", torch.bfloat16)])
def test_connector_files_default_to_the_compute_dtype(
    checkpoints: dict[str, Path], tmp_path: Path, ec_dtype: str | None, expected: torch.dtype
) -> None:
    options = {} if ec_dtype is None else {"ec_dtype": ec_dtype}
    storage = tmp_path / "ec"
    with (
        live_server(
            model=checkpoints["qwen2_vl"], cache_dir=tmp_path / "cache", ec_shared_storage=storage, **options
        ) as server,
        server.client() as client,
    ):
        body = {"items": [{"image": data_uri(noise_image(61, 45, seed=3))}], "encoding_format": "float"}
        item = client.post("/v1/encode", json=body).json()["items"][0]
    stored = load_file(item["ec_cache_path"])["ec_cache"]
    assert stored.dtype == expected  # CPU: float32 compute
    assert torch.equal(stored, rows_of(item).to(expected))
