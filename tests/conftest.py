"""Session fixtures: tiny checkpoints built once by the project's own builder, live servers and an ASGI
client; and the markers that follow from a test's folder."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mmencode.models.tiny import build_tiny
from tests.helpers import LiveServer, asgi_client, live_server

# Nothing may reach a hub; the service must not need to.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


# The suite by shape, one folder each (tests/README.md): unit/ and contract/ run in process, without servers
# or peer environments (`make test-fast`); the others carry the marker of their folder, so no file has to
# say it and no list is kept by hand. A test that is slow for a unit test says so itself (`slow`).
TESTS = Path(__file__).parent
FOLDER_MARKERS = {"e2e": "e2e", "peers": "peers", "vllm_server": "vllm", "sglang_server": "sglang"}
IN_PROCESS = {"unit", "contract"}
SERVER_FIXTURES = {"qwen_server", "internvl_server"}  # session fixtures below: real uvicorn servers


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        folder = item.path.relative_to(TESTS).parts[0]
        marker = FOLDER_MARKERS.get(folder)
        if marker is not None:
            item.add_marker(getattr(pytest.mark, marker))
        elif folder in IN_PROCESS and _starts_a_server(item):
            raise pytest.UsageError(
                f"{item.nodeid} starts a live server: it belongs in tests/e2e (unit/ and contract/ run in process)"
            )


def _starts_a_server(item: pytest.Item) -> bool:
    if SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    function = getattr(item, "function", None)
    return function is not None and "live_server" in function.__code__.co_names


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    return {
        "qwen2_vl": build_tiny(root / "qwen2_vl", "qwen2_vl"),
        "qwen2_vl-vision": build_tiny(root / "qwen2_vl-vision", "qwen2_vl", layout="vision"),
        "siglip": build_tiny(root / "siglip", "siglip"),
        "siglip-vision": build_tiny(root / "siglip-vision", "siglip", layout="vision"),
        "clip": build_tiny(root / "clip", "clip"),
        "clip-vision": build_tiny(root / "clip-vision", "clip", layout="vision"),
        "internvl": build_tiny(root / "internvl", "internvl"),
        # The processor merges 1x1 while the tower merges 2x2: every image drifts 4x.
        "qwen2_vl-mismatched": build_tiny(root / "qwen2_vl-mismatched", "qwen2_vl", processor_merge_size=1),
    }


@pytest.fixture(scope="session")
def qwen_server(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(
        model=checkpoints["qwen2_vl"],
        served_model_name="tiny-qwen2-vl",
        cache_dir=tmp_path_factory.mktemp("cache"),
    ) as server:
        yield server


@pytest.fixture(scope="session")
async def qwen_app(
    checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[httpx.AsyncClient]:
    """What ``qwen_server`` serves, over ASGI: a client for contract tests that need no socket."""
    async with asgi_client(
        model=checkpoints["qwen2_vl"], served_model_name="tiny-qwen2-vl", cache_dir=tmp_path_factory.mktemp("cache")
    ) as client:
        yield client


@pytest.fixture(scope="session")
def internvl_server(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(model=checkpoints["internvl"], cache_dir=tmp_path_factory.mktemp("cache")) as server:
        yield server


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Builds a tiny checkpoint on first use and returns the same directory afterwards."""
    built: dict[tuple[str, tuple[tuple[str, Any], ...]], Path] = {}
    root = tmp_path_factory.mktemp("family-checkpoints")

    def build(family: str, **options: Any) -> Path:
        key = (family, tuple(sorted(options.items())))
        if key not in built:
            name = "-".join([family, *(f"{k}={v}" for k, v in key[1])])
            built[key] = build_tiny(root / name, family, **options)
        return built[key]

    return build


@pytest.fixture
def traversable_dir() -> Iterator[Path]:
    """A fresh folder any user can traverse, as a shared volume's path is (pytest's tmp_path sits under
    0700 folders, which another uid cannot enter)."""
    path = Path(tempfile.mkdtemp(prefix="mmencode-shared-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)
