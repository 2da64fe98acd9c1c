"""bench.audio runs end to end on a short clip: a row per format and rate, with the clip's rows."""

from __future__ import annotations

import sys

import pytest

from bench import audio


def test_the_audio_bench_reports_each_format_and_rate(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench.audio", "--seconds", "2", "--repeats", "1", "--families", "qwen2_audio", "qwen3_omni_moe"]
    monkeypatch.setattr(sys, "argv", argv)
    audio.main()
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line]
    cells = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[1:]]
    formats = [(f, r) for r in ("16000", "44100") for f in ("wav", "flac", "mp3")]
    assert [(c[0], c[1], c[2]) for c in cells] == [(m, *f) for m in ("qwen2_audio", "qwen3_omni_moe") for f in formats]
    # 2 s: 200 mel frames, whatever the format and rate: 50 rows on Qwen2-Audio, two 100-frame chunks of 13
    # rows on Qwen3-Omni.
    assert [c[-1] for c in cells] == ["50"] * 6 + ["26"] * 6
    assert all(float(c[6]) > 0 and float(c[7]) > 0 for c in cells)
