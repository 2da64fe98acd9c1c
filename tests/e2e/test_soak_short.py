"""The overload soak's short mode: nothing lost or hung, only 200/4xx/503, the worker alive."""

from __future__ import annotations

import json
from pathlib import Path

from bench import soak


def test_short_soak_passes(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    options = ["--short", "--duration", "8", "--concurrency", "24", "--max-queue", "4"]
    code = soak.main([*options, "--root", str(tmp_path), "--out", str(out)])
    report = json.loads(out.read_text())
    assert code == 0, report
    assert report["lost"] == 0 and report["hung"] == 0 and report["ready_at_end"] == 200
    statuses = {int(s) for s in report["responses_by_status"] if s.isdigit()}
    assert statuses <= {200, 400, 413, 422, 503} and 200 in statuses, report
