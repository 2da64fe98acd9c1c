"""Security settings at start: a misspelt one stops the start, a public bind without a key warns once."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mmencode.app import cli
from mmencode.app.config import Settings


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[Settings]:
    """``serve`` recorded instead of run: these tests are about what happens before it."""
    for name in list(os.environ):
        if name.upper().startswith("MMENCODE_"):
            monkeypatch.delenv(name)
    calls: list[Settings] = []

    def serve(settings: Settings) -> int:
        calls.append(settings)
        return 0

    monkeypatch.setattr(cli, "serve", serve)
    return calls


def test_a_misspelt_api_key_variable_stops_the_start(
    served: list[Settings], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MMENCODE_API_KEYS", "secret")
    assert cli.main(["serve"]) == 2
    assert served == []
    err = capsys.readouterr().err
    assert "MMENCODE_API_KEYS is not an mmencode setting; did you mean MMENCODE_API_KEY?" in err
    assert "without API keys" in err and "--ignore-unknown-env" in err and "MMENCODE_IGNORE_UNKNOWN_ENV=1" in err
    assert "secret" not in err


def test_a_misspelt_tls_variable_stops_the_start(
    served: list[Settings], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MMENCODE_SSL_CERT_FILE", "/etc/cert.pem")
    assert cli.main(["serve"]) == 2
    assert "did you mean MMENCODE_SSL_CERTFILE?" in capsys.readouterr().err
    assert served == []


@pytest.mark.parametrize("override", [["--ignore-unknown-env"], []])
def test_the_override_starts_anyway_and_still_says_so(
    override: list[str],
    served: list[Settings],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("MMENCODE_API_KEYS", "secret")
    if not override:
        monkeypatch.setenv("MMENCODE_IGNORE_UNKNOWN_ENV", "1")
    assert cli.main(["serve", *override]) == 0
    assert len(served) == 1 and served[0].api_keys() == []
    err = capsys.readouterr().err
    assert "warning: MMENCODE_API_KEYS is not an mmencode setting" in err and "starting anyway" in err


def test_other_typos_only_warn(
    served: list[Settings], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MMENCODE_MODLE", "/m")
    assert cli.main(["serve"]) == 0 and len(served) == 1
    assert "did you mean MMENCODE_MODEL?" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "warns"),
    [
        (["--host", "0.0.0.0"], True),
        (["--host", "::"], True),
        (["--host", "10.1.2.3"], True),
        (["--host", "0.0.0.0", "--api-key", "k"], False),
        ([], False),
        (["--host", "localhost"], False),
        (["--host", "::1"], False),
        (["--host", "127.0.0.2"], False),
    ],
)
def test_a_public_bind_without_a_key_warns_once_loudly(
    args: list[str], warns: bool, served: list[Settings], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["serve", *args]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "NO API KEY" in line]
    assert len(lines) == (1 if warns else 0), lines
    if warns:
        assert lines[0].startswith("mmencode: WARNING: ") and "--api-key" in lines[0]


def test_the_real_command_refuses_at_once() -> None:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("MMENCODE_")}
    result = subprocess.run(
        [sys.executable, "-m", "mmencode", "serve"],
        env={**env, "MMENCODE_API_KEYS": "secret"}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "did you mean MMENCODE_API_KEY?" in result.stderr
