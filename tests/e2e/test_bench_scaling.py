"""bench/scaling.py end to end on the tiny checkpoint: both curves measured through a real service."""

from __future__ import annotations

import json
from pathlib import Path

from bench import scaling


def test_scaling_measures_both_curves(tmp_path: Path) -> None:
    out, png = tmp_path / "scaling.json", tmp_path / "scaling.png"
    options = ["--checkpoint", "tiny", "--root", str(tmp_path), "--concurrency", "1,3", "--requests", "3"]
    options += ["--sizes", "56,112x56,448", "--size-requests", "2", "--out", str(out), "--png", str(png)]
    results = scaling.main(options)

    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert [p["concurrency"] for p in results["concurrency"]] == [1, 3]
    # At least 2 x the level, every one answered.
    assert [p["requests"] for p in results["concurrency"]] == [3, 6]
    assert all(p["statuses"] == {200: p["requests"]} and p["images_per_s"] > 0 for p in results["concurrency"])
    # Rows as the service counts them (14 px patches merged 2x2): 56x56 -> 4x4 patches -> 4 rows.
    # 448x448 is past the tiny processor's 50,176-pixel cap: resized down to 224x224, 64 rows.
    assert [(p["image"], p["rows"]) for p in results["sizes"]] == [("56x56", 4), ("112x56", 8), ("448x448", 64)]
    assert all(0 < p["p50_ms"] <= p["p99_ms"] and p["encoder_ms_per_forward"] > 0 for p in results["sizes"])
    try:
        import matplotlib  # noqa: F401
    except ModuleNotFoundError:
        assert not png.exists()
    else:
        assert png.read_bytes().startswith(b"\x89PNG")
