"""``bench.vs_vllm_encoder`` end to end on a real vLLM encoder instance (``ec_producer``): both sides write a
file per image, the same rows, and the run leaves its table and JSON (bench/README.md's vLLM tables)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import vs_vllm_encoder
from bench.peers.vllm.server import vllm_executable


def test_a_short_run_measures_both_producers_writing_the_same_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    vllm_executable()  # skips (fails under CI) without .venv-vllm
    out = tmp_path / "vs_vllm.json"
    vs_vllm_encoder.main(
        ["--models", "tiny", "--sizes", "448x448", "--concurrency", "2", "--requests", "6", "--rounds", "2",
         "--root", str(tmp_path), "--out", str(out)]
    )  # fmt: skip
    row = json.loads(out.read_text())["models"]["tiny"]["448x448 c=2"]
    for side in ("vllm", "mmencode"):
        assert row[side]["images"] == 12 and row[side]["errors"] == 0, row[side]
        assert row[side]["cpu_s_per_image"] > 0
        assert row["files_written"][side] == 12  # a file per fresh image, on each side
    assert row["max_row_difference_warmup"] < 1e-4  # float32 on both sides: the same rows
    assert "| tiny | 448x448 | 2 |" in capsys.readouterr().out
