"""``bench.vs_sglang`` end to end on a real SGLang: both encoders answer every request of SGLang's own protocol,
with the same rows, and the run leaves its table and JSON (bench/README.md's SGLang tables come from it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import vs_sglang
from bench.peers.sglang.server import sglang_python


def test_a_short_run_measures_both_encoders_on_the_same_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sglang_python()  # skips (fails under CI) without .venv-sglang
    out = tmp_path / "vs_sglang.json"
    vs_sglang.main(
        ["--models", "tiny", "--sizes", "448x448", "--concurrency", "2", "--requests", "6", "--rounds", "2",
         "--root", str(tmp_path), "--out", str(out)]
    )  # fmt: skip
    row = json.loads(out.read_text())["models"]["tiny"]["448x448 c=2"]
    for side in ("sglang", "mmencode"):
        assert row[side]["images"] == 12 and row[side]["errors"] == 0, row[side]
        assert len(row[side]["rounds_images_per_s"]) == 2
        assert row[side]["cpu_s_per_image"] > 0
    assert row["shape_mismatches"] == 0 and row["rows_shape"] == [64, 64]
    assert row["max_row_difference_warmup"] < 1e-4  # float32 on both sides: the same rows
    assert "| tiny | 448x448 | 2 |" in capsys.readouterr().out
