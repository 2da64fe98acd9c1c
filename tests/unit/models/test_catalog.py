"""One catalog (models/catalog.py) behind every family list: the registry, ``serve --help``, ``make-tiny``,
the README table and the family tests."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from mmencode.app.cli import build_parser
from mmencode.models import EncoderAdapter
from mmencode.models.catalog import CATALOG, TINY_FAMILIES
from mmencode.models.registry import supported_model_types
from mmencode.models.tiny import FAMILIES
from tests.families import COVERED_BY_AUDIO_TESTS, COVERED_BY_EQUIVALENCE, family_params

README = Path(__file__).resolve().parents[3] / "docs" / "models.md"


def test_every_catalog_entry_names_an_adapter_and_a_way_to_build_it_tiny() -> None:
    assert sorted(info.model_type for info in CATALOG) == supported_model_types()
    by_type = {info.model_type: info for info in CATALOG}
    for info in CATALOG:
        module, name = info.adapter.split(":")
        adapter = getattr(importlib.import_module(f"mmencode.models.{module}"), name)
        assert issubclass(adapter, EncoderAdapter), info
        assert adapter.family in by_type, info  # the family a hash and the logs name is a catalog entry
        # A model_type without a tiny builder is a layout of one with (a standalone tower: --layout vision).
        if info.tiny is None:
            assert by_type[adapter.family].tiny is not None and info.tower_config == "whole", info
    assert set(TINY_FAMILIES) == set(FAMILIES) == {info.model_type for info in CATALOG if info.tiny}


def test_the_family_tests_cover_every_family_the_catalog_builds() -> None:
    specs = {param if isinstance(param, str) else param.values[0] for param in family_params()}
    assert specs | set(COVERED_BY_EQUIVALENCE) | set(COVERED_BY_AUDIO_TESTS) == set(TINY_FAMILIES)
    equivalence = (Path(__file__).parent / "test_equivalence.py").read_text()
    for family in COVERED_BY_EQUIVALENCE:
        assert f'"{family}"' in equivalence, family
    audio = (Path(__file__).parents[2] / "contract" / "test_audio.py").read_text()
    for family in COVERED_BY_AUDIO_TESTS:
        assert f'"{family}"' in audio, family


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
