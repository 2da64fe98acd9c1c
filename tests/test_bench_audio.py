"""bench.audio runs end to end on a short clip: a row per format and rate, with the clip's rows."""

from __future__ import annotations

import sys

import pytest

from bench import audio


def test_the_audio_bench_reports_each_format_and_rate(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["bench.audio", "--seconds", "2", "--repeats", "1"])
    audio.main()
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line]
    cells = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[1:]]
    assert [(c[0], c[1]) for c in cells] == [(f, r) for r in ("16000", "44100") for f in ("wav", "flac", "mp3")]
    assert all(c[-1] == "50" for c in cells)  # 2 s: 200 mel frames, 50 rows, whatever the format and rate
    assert all(float(c[5]) > 0 and float(c[6]) > 0 for c in cells)
