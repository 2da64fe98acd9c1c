"""Each family added for issue 8, served over HTTP: its metadata, and precomputed items checked against it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.families import FAMILIES, FamilySpec, family_params
from tests.helpers import LiveServer, assert_error, data_uri, live_server, noise_image, precomputed, rows_of

IMAGES = [noise_image(120, 90, seed=1), noise_image(64, 200, seed=2), noise_image(300, 160, seed=3)]


@pytest.fixture(scope="module", params=family_params())
def spec(request: pytest.FixtureRequest) -> FamilySpec:
    return FAMILIES[request.param]


@pytest.fixture(scope="module")
def server(
    spec: FamilySpec, tiny_checkpoint: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    with live_server(model=tiny_checkpoint(spec.family), cache_dir=tmp_path_factory.mktemp("cache")) as running:
        yield running


@pytest.fixture(scope="module")
def encoded(server: LiveServer) -> list[dict[str, Any]]:
    with server.client() as client:
        response = client.post("/v1/encode", json={"items": [{"image": data_uri(image)} for image in IMAGES]})
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


def test_items_carry_their_rows_and_metadata(spec: FamilySpec, encoded: list[dict[str, Any]]) -> None:
    widths = {item["embedding"]["shape"][1] for item in encoded}
    assert len(widths) == 1
    for item in encoded:
        assert item["embedding"]["shape"][0] == item["num_tokens"] > 0
        assert set(spec.required) <= set(item["metadata"])


def test_precomputed_items_with_their_metadata_round_trip(server: LiveServer, encoded: list[dict[str, Any]]) -> None:
    items = [{"precomputed_embedding": precomputed(rows_of(i)), "metadata": i["metadata"]} for i in encoded]
    with server.client() as client:
        response = client.post("/v1/encode", json={"items": items})
    assert response.status_code == 200, response.text
    for got, sent in zip(response.json()["items"], encoded, strict=True):
        assert got["source"] == "precomputed" and got["num_tokens"] == sent["num_tokens"]
        assert torch.equal(rows_of(got), rows_of(sent))


def test_a_precomputed_item_without_its_metadata_is_named(
    spec: FamilySpec, server: LiveServer, encoded: list[dict[str, Any]]
) -> None:
    for field in spec.required:
        metadata = {k: v for k, v in encoded[1]["metadata"].items() if k != field}
        items = [
            {"precomputed_embedding": precomputed(rows_of(encoded[0])), "metadata": encoded[0]["metadata"]},
            {"precomputed_embedding": precomputed(rows_of(encoded[1])), "metadata": metadata},
        ]
        with server.client() as client:
            error = assert_error(client.post("/v1/encode", json={"items": items}), 400, "missing_metadata")
        assert error["param"] == f"items[1].metadata.{field}"
        assert error["details"]["items"][0]["field"] == field


def test_a_precomputed_item_of_the_wrong_shape_is_refused(server: LiveServer, encoded: list[dict[str, Any]]) -> None:
    rows = rows_of(encoded[2])
    # One row short, and the right rows at a wrong width (e.g. Qwen3-VL's main rows without DeepStack).
    for wrong in (rows[:-1], rows[:, : rows.shape[1] // 2]):
        item = {"precomputed_embedding": precomputed(wrong), "metadata": encoded[2]["metadata"]}
        with server.client() as client:
            error = assert_error(client.post("/v1/encode", json={"items": [item]}), 400, "precomputed_shape_mismatch")
        assert error["details"]["items"] == [{"index": 0, "expected": list(rows.shape), "given": list(wrong.shape)}]


def test_a_drifting_checkpoint_answers_token_count_mismatch_per_item(
    spec: FamilySpec, tiny_checkpoint: Callable[..., Path], tmp_path: Path
) -> None:
    if spec.drifting is None:
        pytest.skip(f"{spec.family}: model and processor settings come from one file and cannot disagree")
    drifting = spec.drifting(tiny_checkpoint(spec.family), tmp_path / "drifting")
    with live_server(model=drifting, cache_dir=tmp_path / "cache") as running, running.client() as client:
        items = [{"image": data_uri(image)} for image in IMAGES[:2]]
        error = assert_error(client.post("/v1/encode", json={"items": items}), 500, "token_count_mismatch")
        details = error["details"]
        assert [item["index"] for item in details["items"]] == [0, 1]
        assert all(item["expected"] != item["produced"] for item in details["items"])
        assert details["expected_total"] == sum(item["expected"] for item in details["items"])
        # The worker lives on: readiness holds.
        assert client.get("/ready").status_code == 200
