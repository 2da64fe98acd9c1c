"""A checkpoint whose processor disagrees with its model answers ``token_count_mismatch`` with the numbers."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.helpers import assert_error, data_uri, live_server, noise_image, precomputed


def test_drift_is_reported_per_item_and_the_service_keeps_serving(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    small, tall = noise_image(56, 56, seed=1), noise_image(112, 56, seed=2)
    with live_server(model=checkpoints["qwen2_vl-mismatched"], cache_dir=tmp_path) as server, server.client() as client:
        response = client.post("/v1/encode", json={"items": [{"image": data_uri(small)}, {"image": data_uri(tall)}]})
        error = assert_error(response, 500, "token_count_mismatch")
        assert error["type"] == "server_error"
        details = error["details"]
        # The processor (merge_size 1) predicts one row per patch; the tower merges 2x2 into one.
        assert details["expected_total"] == 4 * details["produced_total"]
        assert details["items"] == [
            {"index": 0, "expected": 16, "produced": 4},
            {"index": 1, "expected": 32, "produced": 8},
        ]
        assert "produced 12 rows" in error["message"] and "predicted 48" in error["message"]

        # The worker is still alive: readiness holds and a request that needs no forward is served.
        assert client.get("/ready").status_code == 200
        grid = {"image_grid_thw": [1, 4, 4]}  # merge_size 1 on the processor side: 16 rows
        ok = client.post(
            "/v1/encode", json={"items": [{"precomputed_embedding": precomputed(torch.ones(16, 64)), "metadata": grid}]}
        )
        assert ok.status_code == 200, ok.text
        again = client.post("/v1/encode", json={"items": [{"image": data_uri(small)}]})
        assert assert_error(again, 500, "token_count_mismatch")["details"]["items"] == [
            {"index": 0, "expected": 16, "produced": 4}
        ]


def test_a_healthy_model_is_served_right_after(qwen_server, checkpoints: dict[str, Path], tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with live_server(model=checkpoints["qwen2_vl-mismatched"], cache_dir=tmp_path) as broken:
        with broken.client() as client:
            assert (
                client.post("/v1/encode", json={"items": [{"image": data_uri(noise_image(56, 56))}]}).status_code == 500
            )
        with qwen_server.client() as client:
            response = client.post("/v1/encode", json={"items": [{"image": data_uri(noise_image(56, 56))}]})
        assert response.status_code == 200, response.text
        assert response.json()["items"][0]["num_tokens"] == 4
