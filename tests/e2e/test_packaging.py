"""The installed distribution: one top-level package, ``mmencode``, never an ``app`` or ``models`` of its own."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

import mmencode

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_installs_one_top_level_package_holding_every_module(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    names = set(zipfile.ZipFile(next(tmp_path.glob("mmencode-*.whl"))).namelist())
    top_level = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top_level == {"mmencode"}
    modules = {
        f"mmencode/{path.relative_to(ROOT)}"
        for pkg in ("app", "models", "schemas")
        for path in (ROOT / pkg).rglob("*.py")
    }
    assert modules <= names, sorted(modules - names)


def test_the_command_and_python_m_run_from_any_directory(tmp_path: Path) -> None:
    # A user's own top-level `app` and `models` next to them are theirs, and mmencode still runs.
    (tmp_path / "app.py").write_text("raise SystemExit('the user app was imported by mmencode')\n")
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "__init__.py").write_text("raise SystemExit('the user models were imported by mmencode')\n")
    for command in (
        [str(Path(sys.executable).with_name("mmencode")), "--version"],
        [sys.executable, "-m", "mmencode", "--version"],
    ):
        result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip().startswith("mmencode ")


def test_the_repository_holds_no_symlinks() -> None:
    # A checkout without symlink support (Git on Windows by default) would write each one as a text file.
    tracked = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert [line for line in tracked.stdout.splitlines() if line.startswith("120000")] == []


def _tracked_copy(destination: Path) -> Path:
    """The tracked files as plain files, as a checkout without symlink support (or an sdist) holds them."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
    for name in filter(None, listed.stdout.split("\0")):
        source = ROOT / name
        if source.is_file():  # tracked files deleted in the working tree stay out
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, destination / name)
    return destination


def _build(backend_call: str, source: Path, out: Path) -> Path:
    """One PEP 517 hook of setuptools, as `python -m build` calls it (without an isolated environment)."""
    out.mkdir(exist_ok=True)
    code = f"from setuptools import build_meta; print(build_meta.{backend_call}({str(out)!r}))"
    result = subprocess.run([sys.executable, "-c", code], cwd=source, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    return out / result.stdout.strip().splitlines()[-1]


@pytest.mark.slow  # builds an sdist, then a wheel from it
def test_an_sdist_builds_and_its_wheel_holds_the_same_package(tmp_path: Path) -> None:
    # What `python -m build` and `uv build` do: an sdist from the tree, then the wheel from the sdist.
    sdist = _build("build_sdist", _tracked_copy(tmp_path / "tree"), tmp_path / "dist")
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path / "unpacked", filter="data")
        sdist_names = archive.getnames()
    (unpacked,) = (tmp_path / "unpacked").iterdir()
    wheel = _build("build_wheel", unpacked, tmp_path / "wheels")
    wheel_modules = {name for name in zipfile.ZipFile(wheel).namelist() if name.endswith(".py")}
    # Every module of the sdist's three folders is in the wheel, under mmencode/, and nothing else.
    sdist_modules = set()
    for name in sdist_names:
        relative = name.split("/", 1)[1] if "/" in name else ""
        if relative.endswith(".py") and relative.split("/")[0] in {"app", "models", "schemas", "mmencode"}:
            sdist_modules.add(relative if relative.startswith("mmencode/") else f"mmencode/{relative}")
    assert wheel_modules == sdist_modules
    assert {
        f"mmencode/{p.relative_to(ROOT)}" for d in ("app", "models", "schemas") for p in (ROOT / d).rglob("*.py")
    } <= wheel_modules

    # Installed from that wheel (dependencies from this environment), it imports from any folder.
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
         "--target", str(target), str(wheel)],
        check=True, capture_output=True,
    )  # fmt: skip
    user = tmp_path / "user"
    user.mkdir()
    (user / "app.py").write_text("raise SystemExit('the user app was imported by mmencode')\n")
    code = "import mmencode, mmencode.app.server; print(mmencode.__version__, mmencode.app.server.__file__)"
    result = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path[:0] = [{str(target)!r}, {str(user)!r}]; {code}"],
        cwd=user, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    version, module_file = result.stdout.split()
    assert Path(module_file).is_relative_to(target)
    assert version == metadata.version("mmencode")


def test_the_version_has_one_source() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert mmencode.__version__ == metadata.version("mmencode")
