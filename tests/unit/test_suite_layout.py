"""The suite's own scheme: markers follow from folders, in-process folders start no server, `make test` runs
everything in stages and `make test-fast` the in-process part, and a missing peer environment skips with
the command that builds it (fails under CI)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests import conftest
from tests.peers import run as peers_run

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"


class _Item:
    """What the collection hook reads of a pytest item."""

    def __init__(self, path: Path, function: Any = None, fixturenames: tuple[str, ...] = ()) -> None:
        self.path, self.function, self.fixturenames, self.nodeid = path, function, fixturenames, str(path)
        self.markers: list[str] = []

    def add_marker(self, marker: pytest.MarkDecorator) -> None:
        self.markers.append(marker.name)


def _plain() -> None:
    pass


def test_markers_follow_from_folders(pytestconfig: pytest.Config) -> None:
    folders = ["unit/engine", "contract", "e2e", "peers", "vllm_server", "sglang_server"]
    items = [_Item(TESTS / folder / "test_x.py", _plain) for folder in folders]
    conftest.pytest_collection_modifyitems(pytestconfig, items)  # type: ignore[arg-type]
    assert [item.markers for item in items] == [[], [], ["e2e"], ["peers"], ["vllm"], ["sglang"]]


def test_a_live_server_in_an_in_process_folder_is_refused(pytestconfig: pytest.Config) -> None:
    for folder in ("unit", "contract"):
        with pytest.raises(pytest.UsageError, match="belongs in tests/e2e"):
            item = _Item(TESTS / folder / "test_x.py", _plain, fixturenames=("qwen_server",))
            conftest.pytest_collection_modifyitems(pytestconfig, [item])  # type: ignore[list-item]


def test_every_folder_of_tests_is_one_the_scheme_names() -> None:
    folders = {path.parent.relative_to(TESTS).parts[0] for path in TESTS.rglob("test_*.py")}
    known = conftest.IN_PROCESS | set(conftest.FOLDER_MARKERS)
    assert folders <= known, folders - known
    assert all((TESTS / folder).is_dir() for folder in known)
    registered = {
        line.split(":")[0]
        for line in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    }
    assert registered == set(conftest.FOLDER_MARKERS.values()) | {"slow", "torchvision"}


def test_make_test_runs_every_folder_and_test_fast_the_in_process_ones() -> None:
    makefile = (ROOT / "Makefile").read_text()
    recipes = dict(re.findall(r"^([\w-]+):[^\n]*\n((?:\t[^\n]*\n)+)", makefile, re.MULTILINE))
    staged = (ROOT / ".ci" / "test").read_text()
    assert "bash .ci/test" in recipes["test"]
    assert staged.index("lint") < staged.index("test-in-process") < staged.index("test-servers")
    every = set(re.findall(r"tests/(\w+)", recipes["test-in-process"] + recipes["test-servers"]))
    assert every == conftest.IN_PROCESS | set(conftest.FOLDER_MARKERS)
    assert set(re.findall(r"tests/(\w+)", recipes["test-fast"])) == conftest.IN_PROCESS
    assert '-m "not slow"' in recipes["test-fast"]
    assert " -m " not in recipes["test-in-process"] + recipes["test-servers"]  # no case left out


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
