"""The installed distribution: one top-level package, ``mmencode``, never an ``app`` or ``models`` of its own."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
