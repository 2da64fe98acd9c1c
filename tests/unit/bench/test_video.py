"""bench.video runs end to end on a short clip: a row per family and sampling, with the frames kept."""

from __future__ import annotations

import sys

import pytest

from bench import video


def test_the_video_bench_reports_the_frames_each_sampling_keeps(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["bench.video", "--seconds", "2", "--families", "qwen3_vl"])
    video.main()
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| qwen3_vl |")]
    assert len(rows) == 3  # the checkpoint's sampling, fps=2 and SGLang's
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[3] == "4"  # 2 s at 30 fps, sampled at 2 fps (by each rule): 4 of its 60 frames
        assert int(cells[-1]) > 0
