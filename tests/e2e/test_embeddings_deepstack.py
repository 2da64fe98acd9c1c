"""/v1/embeddings on Qwen3-VL: the vector pools the main embedding, not the DeepStack levels beside it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from tests.helpers import data_uri, live_server, noise_image, rows_of


def test_the_pooled_vector_is_the_main_embeddings_mean(tiny_checkpoint: Callable[..., Path], tmp_path: Path) -> None:
    image = data_uri(noise_image(97, 61, seed=5))
    with live_server(model=tiny_checkpoint("qwen3_vl"), cache_dir=tmp_path) as server, server.client() as client:
        model = client.get("/v1/models").json()["data"][0]["id"]
        item = client.post("/v1/encode", json={"items": [{"image": image}]}).json()["items"][0]
        body = {"model": model, "input": [image]}
        pooled = client.post("/v1/embeddings", json=body).json()["data"][0]["embedding"]
        wide = sum(item["metadata"]["deepstack_split"])
        too_wide = client.post("/v1/embeddings", json={**body, "dimensions": wide})
    main_width, *levels = item["metadata"]["deepstack_split"]
    assert levels and len(pooled) == main_width
    expected = torch.nn.functional.normalize(rows_of(item)[:, :main_width].mean(dim=0), dim=0)
    assert torch.allclose(torch.tensor(pooled), expected, atol=1e-6)
    # The whole row's width is not a dimension this model's vectors have.
    assert too_wide.status_code == 400 and too_wide.json()["error"]["details"]["supported"] == [main_width]
