"""Session fixtures: tiny checkpoints built once by the project's own builder, live servers and an ASGI
client; and the markers that follow from a test's place and fixtures."""

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


# Markers (registered in pyproject.toml) that follow from where a test is and what it uses, so no file
# has to say them: ``make test-fast`` deselects all four, ``make test`` runs everything.
E2E_DIR = Path(__file__).parent / "e2e"
SERVER_FIXTURES = {"qwen_server", "internvl_server"}  # session fixtures below: real uvicorn servers
PEERS_MODULE = "tests.peers.run"
# End-to-end files whose tests start processes (mmencode serve, redis, haproxy, the peers' decoders) and
# take more than ~2 s each here: all slow, so `-m "e2e and not slow"` is a quick end-to-end pass.
SLOW_E2E_FILES = {
    "test_audio_peers.py", "test_bad_model.py", "test_bench_gpu.py", "test_cli.py", "test_cli_settings.py",
    "test_haproxy_local.py", "test_load_balancer.py", "test_make_tiny.py", "test_quiet_probes.py", "test_sglang.py",
    "test_sglang_video_sampling.py", "test_shared_cache.py", "test_soak_short.py", "test_tls.py", "test_vllm.py",
}  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if E2E_DIR in item.path.parents or _starts_a_server(item):
            item.add_marker(pytest.mark.e2e)
        if _uses_peers(item):
            item.add_marker(pytest.mark.peers)
        if item.get_closest_marker("vllm") is not None or (
            item.path.parent == E2E_DIR and item.path.name in SLOW_E2E_FILES
        ):
            item.add_marker(pytest.mark.slow)


def _starts_a_server(item: pytest.Item) -> bool:
    if SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    function = getattr(item, "function", None)
    return function is not None and "live_server" in function.__code__.co_names


def _uses_peers(item: pytest.Item) -> bool:
    """The test's module imports from tests/peers/run.py: it runs code in the peers venv."""
    module = getattr(item, "module", None)
    return module is not None and any(
        getattr(value, "__module__", None) == PEERS_MODULE for value in vars(module).values()
    )


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
