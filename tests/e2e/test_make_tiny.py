"""``mmencode make-tiny`` as a user runs it: it never wipes a folder, and what it writes others can read."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from tests.helpers import IMAGE_UID, python_as

# The user the Dockerfile creates and runs the service as.
ROOT = Path(__file__).resolve().parents[2]


def test_the_image_runs_as_the_uid_these_tests_read_as() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"--uid {IMAGE_UID} mmencode" in dockerfile and "\nUSER mmencode\n" in dockerfile


def _make_tiny(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mmencode", "make-tiny", *args], capture_output=True, text=True, timeout=120
    )


def test_a_folder_with_a_file_in_it_is_left_intact(tmp_path: Path) -> None:
    target = tmp_path / "real-checkpoint"
    target.mkdir()
    (target / "model.safetensors").write_bytes(b"precious weights")

    result = _make_tiny(str(target))

    assert result.returncode != 0
    assert "not empty" in result.stderr and "--force" in result.stderr
    assert "Traceback" not in result.stderr
    assert [p.name for p in target.iterdir()] == ["model.safetensors"]
    assert (target / "model.safetensors").read_bytes() == b"precious weights"


def test_force_replaces_a_non_empty_folder_and_an_empty_one_needs_no_force(tmp_path: Path) -> None:
    target = tmp_path / "old"
    target.mkdir()
    (target / "stale.txt").write_text("old")
    result = _make_tiny(str(target), "--family", "siglip", "--force")
    assert result.returncode == 0, result.stderr
    assert not (target / "stale.txt").exists() and (target / "model.safetensors").is_file()

    empty = tmp_path / "empty"
    empty.mkdir()
    assert _make_tiny(str(empty), "--family", "siglip").returncode == 0
    assert (empty / "config.json").is_file()


def test_what_make_tiny_writes_is_readable_by_the_container_user(traversable_dir: Path) -> None:
    model = traversable_dir / "model"
    assert _make_tiny(str(model)).returncode == 0
    for path in [model, *model.rglob("*")]:
        mode = path.stat().st_mode
        assert mode & stat.S_IROTH, f"{path} is not world-readable: {oct(mode)}"
        if path.is_dir():
            assert mode & stat.S_IXOTH, f"{path} is not world-traversable: {oct(mode)}"
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return  # the mode bits above are what the container user relies on
    # Read every file as the image's uid, as the container does through its read-only volume.
    reader = "import pathlib, sys; [p.read_bytes() for p in pathlib.Path(sys.argv[1]).rglob('*') if p.is_file()]"
    result = python_as(IMAGE_UID, reader, str(model))
    assert result.returncode == 0, result.stderr
