"""The README's "Serving a real model" section matches what the service loads."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from mmencode.app.cli import build_parser
from mmencode.models.registry import supported_families, supported_model_types

README = (Path(__file__).resolve().parents[3] / "docs" / "models.md").read_text()
SECTION = README.split("## Serving a real model", 1)[1].split("\n## ", 1)[0]


def _commands() -> list[list[str]]:
    block = re.search(r"```bash\n(.*?)```", SECTION, re.S)
    assert block is not None
    return [shlex.split(line) for line in block.group(1).splitlines() if line.strip() and not line.startswith("#")]


def test_each_example_serves_the_folder_it_downloaded_with_flags_the_cli_takes() -> None:
    commands = _commands()
    downloads = [c for c in commands if c[:2] == ["hf", "download"]]
    serves = [c for c in commands if c[:2] == ["mmencode", "serve"]]
    assert len(downloads) == len(serves) >= 4
    for download, serve in zip(downloads, serves, strict=True):
        local_dir = download[download.index("--local-dir") + 1]
        assert "*.safetensors" in download  # only safetensors load
        args = build_parser().parse_args(serve[1:])
        assert args.model == local_dir


def test_every_family_has_a_worked_example_and_the_table_lists_every_model_type() -> None:
    headings = [line for line in SECTION.splitlines() if line.startswith("# ")]
    block = "\n".join(headings).lower()
    for family in supported_families():
        assert family.replace("_5", ".5").replace("_", "-") in block, family  # qwen2_5_vl: "qwen2.5-vl"
    table = SECTION.split("| `model_type` |", 1)[1].split("\n\n", 1)[0]
    table_types = {name for row in table.splitlines()[2:] for name in re.findall(r"`([a-z0-9_]+)`", row.split("|")[1])}
    listed = table_types & set(supported_model_types())
    # "(+ `_vision`)" stands for the *_vision standalone towers.
    assert listed | {f"{t}_vision" for t in listed} >= set(supported_model_types())
