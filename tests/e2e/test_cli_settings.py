"""Settings as an operator gives them: flags and ``MMENCODE_*`` variables, through the real CLI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mmencode.app.config import Settings, unknown_environment


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mmencode", *args],
        capture_output=True, text=True, timeout=90, env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_allowed_url_hosts_takes_a_comma_list_from_the_environment_like_the_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MMENCODE_ALLOWED_URL_HOSTS", "images.internal, cdn.internal")
    assert Settings().allowed_url_hosts == ["images.internal", "cdn.internal"]
    monkeypatch.setenv("MMENCODE_ALLOWED_URL_HOSTS", "images.internal")
    assert Settings().allowed_url_hosts == ["images.internal"]
    monkeypatch.setenv("MMENCODE_ALLOWED_URL_HOSTS", '["a", "b"]')  # the JSON form still works
    assert Settings().allowed_url_hosts == ["a", "b"]


def test_sizes_take_units(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MMENCODE_CACHE_BYTES", "1GiB")
    settings = Settings(max_body_bytes="512MiB", max_image_bytes="20MiB")
    assert settings.cache_bytes == 1 << 30
    assert settings.max_body_bytes == 512 << 20 and settings.max_image_bytes == 20 << 20
    assert Settings(cache_bytes=0).cache_bytes == 0  # plain integers still work


def test_a_misspelled_variable_is_named_with_a_suggestion() -> None:
    warnings = unknown_environment({"MMENCODE_MODLE": "/m", "MMENCODE_PORT": "1", "PATH": "/bin"})
    assert warnings == ["MMENCODE_MODLE is not an mmencode setting and is ignored; did you mean MMENCODE_MODEL?"]
    # Kubernetes' service-link variables for a Service named "mmencode" are not typos.
    links = {"MMENCODE_SERVICE_HOST": "10.0.0.7", "MMENCODE_SERVICE_PORT_HTTP": "8000", "MMENCODE_PORT_8000_TCP": "x"}
    assert unknown_environment(links) == []


def test_serve_warns_about_unknown_variables_and_reports_bad_values_in_one_line_each(tmp_path: Path) -> None:
    result = _cli(
        "serve", "--model", str(tmp_path / "missing"),
        env={"MMENCODE_MODLE": "/models/x", "MMENCODE_ALLOWED_URL_HOSTS": "a,b"},
    )  # fmt: skip
    assert result.returncode == 2
    assert "warning: MMENCODE_MODLE is not an mmencode setting" in result.stderr
    assert "did you mean MMENCODE_MODEL?" in result.stderr
    assert "Traceback" not in result.stderr  # the comma list no longer crashes

    bad = _cli("serve", "--max-body-bytes", "12XB", "--api-key", "s3cret-key", "--ssl-certfile", "/nope")
    assert bad.returncode == 2
    assert "invalid setting --max-body-bytes" in bad.stderr
    assert "s3cret-key" not in bad.stderr and "Traceback" not in bad.stderr


def test_help_describes_every_option_with_its_real_default() -> None:
    help_text = _cli("serve", "--help").stdout
    assert "computed" not in help_text
    flat = re.sub(r"\s+", " ", help_text)
    for name, info in Settings.model_fields.items():
        assert info.description, f"{name} has no description"
        assert f"--{name.replace('_', '-')}" in help_text
        assert f"MMENCODE_{name.upper()}" in flat
    assert "[default: 512MiB; env MMENCODE_CACHE_BYTES]" in flat
    assert f"[default: {Settings().preprocess_workers}; env MMENCODE_PREPROCESS_WORKERS]" in flat


def test_version() -> None:
    result = _cli("--version")
    assert result.returncode == 0
    assert re.match(r"mmencode \d+\.\d+\.\d+ \(torch \S+, transformers \S+, python 3\.\d+", result.stdout)
