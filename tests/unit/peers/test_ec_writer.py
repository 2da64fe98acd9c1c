"""vLLM encoder-cache files get the modes a downloaded file gets, so a consumer running as another uid reads them."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from mmencode.app.metrics import Metrics
from mmencode.app.peers.vllm.ec_writer import EncoderCacheWriter
from tests.helpers import IMAGE_UID, python_as


@pytest.fixture
def umask() -> Iterator[None]:
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def _write(root: Path) -> Path:
    writer = EncoderCacheWriter(root, "bfloat16", Metrics())
    written = writer.write("0123abcd" * 4, torch.randn(6, 8))
    assert written is not None
    return written


def test_files_and_folders_get_0644_and_0755_under_umask_022(umask: None, traversable_dir: Path) -> None:
    root = traversable_dir / "ec"
    written = _write(root)
    assert stat.S_IMODE(written.stat().st_mode) == 0o644
    assert stat.S_IMODE(written.parent.stat().st_mode) == 0o755
    assert stat.S_IMODE(root.stat().st_mode) == 0o755
    assert not [p for p in written.parent.iterdir() if p.name.startswith(".")], "no temporary file is left behind"


def test_a_stricter_umask_is_respected(traversable_dir: Path) -> None:
    previous = os.umask(0o077)
    try:
        written = _write(traversable_dir / "ec")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    assert stat.S_IMODE(written.parent.stat().st_mode) == 0o700


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv to switch to another uid"
)
def test_another_uid_reads_the_connector_file(umask: None, traversable_dir: Path) -> None:
    written = _write(traversable_dir / "ec")
    # What ECExampleConnector does first: list the folder, then read the safetensors header and data.
    reader = (
        "import json, pathlib, struct, sys; p = pathlib.Path(sys.argv[1]); list(p.parent.iterdir()); "
        "data = p.read_bytes(); n = struct.unpack('<Q', data[:8])[0]; "
        "print(json.loads(data[8:8 + n])['ec_cache']['shape'])"
    )
    result = python_as(IMAGE_UID, reader, str(written))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[6, 8]"
