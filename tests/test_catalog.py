"""The family list users read (README, ``serve --help``, ``make-tiny``) is the list the registry serves."""

from __future__ import annotations

import re
from pathlib import Path

from mmencode.app.cli import build_parser
from mmencode.models.catalog import CATALOG, TINY_FAMILIES
from mmencode.models.registry import supported_model_types
from mmencode.models.tiny import FAMILIES

README = Path(__file__).resolve().parents[1] / "README.md"


def test_catalog_lists_exactly_the_served_model_types() -> None:
    assert sorted(info.model_type for info in CATALOG) == supported_model_types()
    assert sorted(TINY_FAMILIES) == sorted(FAMILIES)


def test_readme_table_has_a_row_for_every_model_type() -> None:
    text = README.read_text()
    table = text[text.index("| `model_type` |") :].split("\n\n", 1)[0]
    rows = table.splitlines()[2:]
    listed = {name for row in rows for name in re.findall(r"`([a-z0-9_]+)`", row.split("|")[1])}
    assert listed == set(supported_model_types())


def test_serve_help_lists_every_model_type(capsys) -> None:  # type: ignore[no-untyped-def]
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    text = serve.format_help()
    for info in CATALOG:
        assert re.search(rf"^\s+{info.model_type}\s+metadata: ", text, re.MULTILINE), info.model_type
