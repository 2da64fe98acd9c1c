"""The suite's own scheme: which tests carry which marker, what `make test-fast` leaves out, and that a
missing peers environment skips with the command that builds it (fails under CI)."""

from __future__ import annotations

import re
import tomllib
import types
from pathlib import Path
from typing import Any

import pytest

from tests import conftest
from tests.helpers import live_server
from tests.peers import run as peers_run

ROOT = Path(__file__).resolve().parents[1]
FAST = "not e2e and not peers and not slow and not vllm"


class _Item:
    """What the collection hook reads of a pytest item."""

    def __init__(self, path: Path, function: Any, module: Any = None, fixturenames: tuple[str, ...] = ()) -> None:
        self.path, self.function, self.module, self.fixturenames = path, function, module, fixturenames
        self.markers: list[str] = []

    def add_marker(self, marker: pytest.MarkDecorator) -> None:
        self.markers.append(marker.name)

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.markers else None


def _plain() -> None:
    pass


def _serving() -> None:  # never called: the hook reads the names it uses
    with live_server():
        pass


def test_markers_follow_from_directory_fixtures_and_imports(pytestconfig: pytest.Config) -> None:
    tests = ROOT / "tests"
    peers_module = types.SimpleNamespace(vllm_decode=peers_run.vllm_decode)
    items = [
        _Item(tests / "test_x.py", _plain, types.SimpleNamespace()),
        _Item(tests / "e2e" / "test_x.py", _plain, types.SimpleNamespace()),
        _Item(tests / "test_x.py", _plain, types.SimpleNamespace(), fixturenames=("qwen_server",)),
        _Item(tests / "test_x.py", _serving, types.SimpleNamespace()),
        _Item(tests / "e2e" / "test_x.py", _plain, peers_module),
        _Item(tests / "e2e" / "test_tls.py", _plain, types.SimpleNamespace()),
    ]
    items[0].markers.append("vllm")
    conftest.pytest_collection_modifyitems(pytestconfig, items)  # type: ignore[arg-type]
    assert [sorted(item.markers) for item in items] == [
        ["slow", "vllm"],
        ["e2e"],
        ["e2e"],
        ["e2e"],
        ["e2e", "peers"],
        ["e2e", "slow"],
    ]


def test_the_slow_end_to_end_files_exist() -> None:
    assert {path.name for path in conftest.E2E_DIR.glob("test_*.py")} >= conftest.SLOW_E2E_FILES


def test_make_test_runs_every_marker_and_test_fast_leaves_out_the_registered_ones() -> None:
    makefile = (ROOT / "Makefile").read_text()
    recipes = dict(re.findall(r"^(test|test-fast):[^\n]*\n((?:\t[^\n]*\n)+)", makefile, re.MULTILINE))
    # Workers and how files are dealt out to them, but no marker selection: make test runs everything.
    pytest_line = next(line for line in recipes["test"].splitlines() if "-m pytest" in line)
    assert " -m " not in pytest_line.split("-m pytest", 1)[1].split("#")[0], pytest_line
    assert f'-m pytest -m "{FAST}"' in recipes["test-fast"]
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "-m" not in options.get("addopts", "")  # a bare pytest, and so make test, runs everything
    registered = {line.split(":")[0] for line in options["markers"]}
    assert registered == {"e2e", "peers", "slow", "torchvision", "vllm"}
    assert set(re.findall(r"not (\w+)", FAST)) == registered - {"torchvision"}


@pytest.mark.parametrize(("ci", "outcome"), [(None, pytest.skip.Exception), ("true", pytest.fail.Exception)])
def test_a_missing_peers_venv_skips_with_its_make_target_and_fails_under_ci(
    ci: str | None, outcome: type[BaseException], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(peers_run, "PEERS_PYTHON", tmp_path / "missing" / "python")
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="make peers"):
        peers_run.peers_python()
